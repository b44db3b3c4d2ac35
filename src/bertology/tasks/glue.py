"""GLUE from its official TSV files (the layout the GLUE download script unpacks).

Each task directory holds train.tsv and dev.tsv (MNLI: dev_matched.tsv and dev_mismatched.tsv)
and, optionally, the unlabeled test file(s) whose predictions go to the leaderboard. Columns are
found by header name; CoLA's train and dev files have no header (source, label, mark, sentence).
Files are read as the reference BERT code reads them: tab-separated, no quoting.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import pathlib
import sys
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.evaluation import classification as metrics
from bertology.tasks import Example, Task, builder, data_dir

csv.field_size_limit(sys.maxsize)


@dataclasses.dataclass(frozen=True)
class Spec:
    directory: str  # as in the GLUE download: CoLA, SST-2, ...
    text_a: str
    text_b: str | None
    label: str
    labels: tuple[str, ...]  # () for STS-B (a regression)
    splits: tuple[tuple[str, str], ...]  # (split, file); train and validation ones must exist
    submissions: tuple[tuple[str, str], ...]  # (test split, leaderboard file name)
    index: str = "index"


_NLI = ("entailment", "not_entailment")
SPECS: dict[str, Spec] = {
    "cola": Spec("CoLA", "sentence", None, "label", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "CoLA.tsv"),)),
    "sst2": Spec("SST-2", "sentence", None, "label", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "SST-2.tsv"),)),
    "mrpc": Spec("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "MRPC.tsv"),)),
    "qqp": Spec("QQP", "question1", "question2", "is_duplicate", ("0", "1"),
                (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "QQP.tsv"),), "id"),
    "stsb": Spec("STS-B", "sentence1", "sentence2", "score", (),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "STS-B.tsv"),)),
    "mnli": Spec("MNLI", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
                 (("train", "train.tsv"), ("validation_matched", "dev_matched.tsv"),
                  ("validation_mismatched", "dev_mismatched.tsv"), ("test_matched", "test_matched.tsv"),
                  ("test_mismatched", "test_mismatched.tsv")),
                 (("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv"))),
    "qnli": Spec("QNLI", "question", "sentence", "label", _NLI,
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "QNLI.tsv"),)),
    "rte": Spec("RTE", "sentence1", "sentence2", "label", _NLI,
                (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "RTE.tsv"),)),
    "wnli": Spec("WNLI", "sentence1", "sentence2", "label", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "WNLI.tsv"),)),
}
_COLA_COLUMNS = ("source", "label", "mark", "sentence")


def _rows(path: pathlib.Path, headerless: bool) -> Iterator[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = list(_COLA_COLUMNS) if headerless else next(reader)
        for row in reader:
            if len(row) >= len(header):  # a few rows of the QQP/MNLI releases are truncated
                yield dict(zip(header, row))


def parse(spec: Spec, path: pathlib.Path, headerless: bool = False) -> Iterator[Example]:
    """Examples {idx, text_a, text_b, label}; label -1 where the file has none (test)."""
    regression = not spec.labels
    for i, row in enumerate(_rows(path, headerless)):
        raw = row.get(spec.label)
        if raw is None or raw == "":
            label = -1.0 if regression else -1
        else:
            label = float(raw) if regression else spec.labels.index(raw)
        yield {
            "idx": int(row.get(spec.index, i)),
            "text_a": row[spec.text_a],
            "text_b": row[spec.text_b] if spec.text_b else "",
            "label": label,
        }


def _load(name: str, directory: str | None, cache_dir=None, log=print) -> dict[str, list[Example]]:
    spec = SPECS[name]
    root = data_dir(directory, f"glue/{spec.directory}")
    hint = f"put the GLUE {spec.directory} files there (or set --config.data.dir to the {spec.directory} directory)"
    files = {}
    for split, file in spec.splits:
        path = root / file
        if split.startswith("test") and not path.is_file():
            continue  # test files only matter for leaderboard submissions
        files[split] = builder.require(path, name, hint)
    parsers = {
        split: functools.partial(parse, spec, path, headerless=name == "cola" and not split.startswith("test"))
        for split, path in files.items()
    }
    features = {
        "idx": np.int64, "text_a": tfds.features.Text(), "text_b": tfds.features.Text(),
        "label": np.float32 if not spec.labels else np.int64,
    }
    return builder.load(f"glue_{name}", features, parsers, list(files.values()), cache_dir, log)


def _score(name: str, examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    labels = np.array([e["label"] for e in examples])
    if name == "stsb":
        return {"pearson": 100 * metrics.pearson(predictions, labels), "spearman": 100 * metrics.spearman(predictions, labels)}
    out = {"accuracy": 100 * metrics.accuracy(predictions, labels)}
    if name == "cola":
        out["mcc"] = 100 * metrics.matthews_corrcoef(predictions, labels)
    if name in ("mrpc", "qqp"):
        out["f1"] = 100 * metrics.f1_binary(predictions, labels)
    return out


_PRIMARY = {"cola": "mcc", "stsb": "spearman", "mrpc": "f1", "qqp": "f1"}

TASKS: dict[str, Task] = {
    name: Task(
        name=name,
        kind="classification" if spec.labels else "regression",
        labels=spec.labels,
        primary=_PRIMARY.get(name, "accuracy"),
        load=functools.partial(_load, name),
        score=functools.partial(_score, name),
        eval_splits=tuple(s for s, _ in spec.splits if s.startswith("validation")),
        submissions=spec.submissions,
    )
    for name, spec in SPECS.items()
}
