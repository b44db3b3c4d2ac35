"""SWAG from the official CSV files (train.csv, val.csv, optionally test.csv).

Columns: an unnamed index, video-id, fold-ind, startphrase, sent1, sent2, gold-source,
ending0..ending3, label (test.csv has no label); quoted as CSV (endings hold commas). As in the
BERT paper, each choice is the pair (sent1, sent2 + ending): the context sentence, then the second
sentence's start completed by that ending. A row with the wrong field count or no label is skipped
and counted; a label outside 0-3, or a header without these columns, is an error.
"""

from __future__ import annotations

import csv
import functools
import io
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.errors import UserError
from bertology.evaluation import classification as metrics
from bertology.tasks import Example, Task, builder, data_dir

FILES = {"train": "train.csv", "validation": "val.csv", "test": "test.csv"}


CHOICES = ("0", "1", "2", "3")


def parse(path: pathlib.Path, split: str, read: builder.Read) -> Iterator[Example]:
    read.source = str(path)
    reader = csv.reader(io.StringIO(builder.read_text(path), newline=""))
    header = next(reader, [])
    labelled = split != "test"
    needed = ["sent1", "sent2", *(f"ending{k}" for k in range(4)), *(["label"] if labelled else [])]
    if missing := [c for c in needed if c not in header]:
        raise UserError(f"{path}:1: the header lacks column(s) {missing}; not SWAG's {path.name}, use the official release")
    n = 0
    for fields in reader:
        if len(fields) != len(header):
            read.skip("wrong field count")
            continue
        row = dict(zip(header, fields))
        label = -1
        if labelled:
            if row["label"] == "":
                read.skip("no label")
                continue
            if row["label"] not in CHOICES:
                raise UserError(f"{path}:{reader.line_num}: label {row['label']!r} is not one of 0-3; "
                                "fix the row or use the official SWAG release")
            label = int(row["label"])
        yield {
            "idx": n,
            "context": row["sent1"],
            "endings": [f"{row['sent2']} {row[f'ending{k}']}".strip() for k in range(4)],
            "label": label,
        }
        n += 1


def _load(directory: str | None, cache_dir=None, log=print) -> dict[str, list[Example]]:
    root = data_dir(directory, "swag")
    files = {}
    for split, name in FILES.items():
        if split == "test" and not (root / name).is_file():
            continue
        files[split] = builder.require(root / name, "swag", "put the official SWAG CSV files (train.csv, val.csv) there")
    features = {"idx": np.int64, "context": tfds.features.Text(),
                "endings": tfds.features.Sequence(tfds.features.Text()), "label": np.int64}
    parsers = {split: functools.partial(parse, path, split) for split, path in files.items()}
    return builder.load("swag", features, parsers, list(files.values()), cache_dir, log)


def _score(examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    return {"accuracy": 100 * metrics.accuracy(predictions, [e["label"] for e in examples])}


TASKS = {
    "swag": Task(name="swag", kind="choice", labels=("0", "1", "2", "3"), primary="accuracy", load=_load, score=_score),
}
