"""SWAG from the official CSV files (train.csv, val.csv, optionally test.csv).

Columns: video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..ending3, label
(test.csv has no label). As in the BERT paper, each choice is the pair (sent1, sent2 + ending):
the context sentence, then the second sentence's start completed by that ending.
"""

from __future__ import annotations

import csv
import functools
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.evaluation import classification as metrics
from bertology.tasks import Example, Task, builder, data_dir

FILES = {"train": "train.csv", "validation": "val.csv", "test": "test.csv"}


def parse(path: pathlib.Path) -> Iterator[Example]:
    with open(path, encoding="utf-8", newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            yield {
                "idx": i,
                "context": row["sent1"],
                "endings": [f"{row['sent2']} {row[f'ending{k}']}".strip() for k in range(4)],
                "label": int(row["label"]) if row.get("label") not in (None, "") else -1,
            }


def _load(directory: str | None, cache_dir=None, log=print) -> dict[str, list[Example]]:
    root = data_dir(directory, "swag")
    files = {}
    for split, name in FILES.items():
        if split == "test" and not (root / name).is_file():
            continue
        files[split] = builder.require(root / name, "swag", "put the official SWAG CSV files (train.csv, val.csv) there")
    features = {"idx": np.int64, "context": tfds.features.Text(),
                "endings": tfds.features.Sequence(tfds.features.Text()), "label": np.int64}
    parsers = {split: functools.partial(parse, path) for split, path in files.items()}
    return builder.load("swag", features, parsers, list(files.values()), cache_dir, log)


def _score(examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    return {"accuracy": 100 * metrics.accuracy(predictions, [e["label"] for e in examples])}


TASKS = {
    "swag": Task(name="swag", kind="choice", labels=("0", "1", "2", "3"), primary="accuracy", load=_load, score=_score),
}
