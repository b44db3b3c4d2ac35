"""GLUE from its official TSV files (the layout the GLUE download script unpacks).

Each task directory holds train.tsv and dev.tsv (MNLI: dev_matched.tsv and dev_mismatched.tsv,
both scored) and, optionally, the unlabeled test file(s) whose predictions go to the leaderboard.
Columns are found by header name; CoLA's train and dev files have no header (source, label,
mark, sentence). The files are read as released:

- tab-separated with no quote processing: a `"` is text (MRPC and MNLI sentences start with one,
  and unbalanced quotes would swallow the lines after them);
- MRPC's train and dev headers start with a UTF-8 byte-order mark (the download script copies it
  from the MSR release), which is dropped before the header is matched;
- a row whose field count differs from the header's is skipped and counted: QQP's train.tsv has
  questions broken across lines by a newline, leaving rows with missing fields; a tab inside a
  sentence cannot be told apart from a column break. Empty fields left by a trailing tab are dropped.
- a labelled row with an empty label is skipped and counted; a label outside the task's label set
  (STS-B: a score outside 0..5) is an error naming the file and line, as no GLUE release has one.
- a file that loses more than 1% of its rows that way is refused, naming its first skipped line
  (`data.max_skipped_fraction` allows more); QQP, whose release has such rows, has no limit.

A file whose header lacks the task's columns, or none of whose rows has the header's field
count, is not the task's file: an error, never a silent run on nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.errors import UserError
from bertology.evaluation import classification as metrics
from bertology.tasks import Example, Task, builder, data_dir


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
    broken_rows: bool = False  # the release itself has rows that must be skipped (QQP's)


_NLI = ("entailment", "not_entailment")
SPECS: dict[str, Spec] = {
    "cola": Spec("CoLA", "sentence", None, "label", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "CoLA.tsv"),)),
    "sst2": Spec("SST-2", "sentence", None, "label", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "SST-2.tsv"),)),
    "mrpc": Spec("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"),
                 (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "MRPC.tsv"),)),
    "qqp": Spec("QQP", "question1", "question2", "is_duplicate", ("0", "1"),
                (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "test.tsv")), (("test", "QQP.tsv"),), "id",
                broken_rows=True),
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
_COLA_COLUMNS = ["source", "label", "mark", "sentence"]
STSB_RANGE = (0.0, 5.0)  # similarity scores are averaged 0-5 ratings


def _table(path: pathlib.Path, headerless: bool) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header and (line number, fields) of each row, split on tabs and nothing else."""
    lines = builder.read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()
    if headerless:
        header, first = list(_COLA_COLUMNS), 1
    else:
        header, first = (lines[0].rstrip("\r").split("\t") if lines else []), 2
    return header, ((n, line.rstrip("\r").split("\t")) for n, line in enumerate(lines[first - 1:], first))


def _label(spec: Spec, raw: str, path: pathlib.Path, line: int) -> int | float:
    if not spec.labels:
        try:
            score = float(raw)
        except ValueError:
            score = float("nan")
        if not STSB_RANGE[0] <= score <= STSB_RANGE[1]:
            raise UserError(f"{path}:{line}: score {raw!r} is not a number in {STSB_RANGE}; "
                            "fix the row or use the official STS-B release")
        return score
    if raw not in spec.labels:
        raise UserError(f"{path}:{line}: label {raw!r} is not one of {list(spec.labels)}; "
                        f"fix the row or use the official GLUE {spec.directory} release")
    return spec.labels.index(raw)


def parse(spec: Spec, path: pathlib.Path, split: str, read: builder.Read) -> Iterator[Example]:
    """Examples {idx, text_a, text_b, label}; label -1 in the unlabelled test splits."""
    read.source = str(path)
    labelled = not split.startswith("test")
    header, rows = _table(path, headerless=labelled and spec.directory == "CoLA")
    needed = [c for c in (spec.text_a, spec.text_b) if c]
    needed += [spec.label] if labelled else [spec.index]
    if missing := [c for c in needed if c not in header]:
        raise UserError(f"{path}:1: the header lacks column(s) {missing} (it has {header}); "
                        f"not the GLUE {spec.directory} {split} file, use the official release")
    well_formed = 0
    for line, fields in rows:
        if len(fields) > len(header) and not any(fields[len(header):]):
            fields = fields[:len(header)]
            read.convert("trailing tab")
        if len(fields) != len(header):
            read.skip(f"{'missing' if len(fields) < len(header) else 'extra'} fields", line)
            continue
        well_formed += 1
        row = dict(zip(header, fields))
        if labelled and row[spec.label] == "":
            read.skip("no label", line)
            continue
        index = row.get(spec.index, str(well_formed - 1))
        if not index.isdigit():
            raise UserError(f"{path}:{line}: {spec.index} {index!r} is not a number; use the official GLUE release")
        yield {
            "idx": int(index),
            "text_a": row[spec.text_a],
            "text_b": row[spec.text_b] if spec.text_b else "",
            "label": _label(spec, row[spec.label], path, line) if labelled else (-1 if spec.labels else -1.0),
        }
    if read.skipped and not well_formed:
        raise UserError(f"{path}: no row has the header's {len(header)} tab-separated fields; "
                        f"not the GLUE {spec.directory} layout, use the official release")


def _load(name: str, directory: str | None, cache_dir=None, log=print,
          max_skipped_fraction: float | None = None) -> dict[str, list[Example]]:
    spec = SPECS[name]
    root = data_dir(directory, f"glue/{spec.directory}")
    hint = f"put the GLUE {spec.directory} files there (or set --config.data.dir to the {spec.directory} directory)"
    files = {}
    for split, file in spec.splits:
        path = root / file
        if split.startswith("test") and not path.is_file():
            continue  # test files only matter for leaderboard submissions
        files[split] = builder.require(path, name, hint)
    parsers = {split: functools.partial(parse, spec, path, split) for split, path in files.items()}
    features = {
        "idx": np.int64, "text_a": tfds.features.Text(), "text_b": tfds.features.Text(),
        "label": np.float32 if not spec.labels else np.int64,
    }
    splits = builder.load(f"glue_{name}", features, parsers, list(files.values()), cache_dir, log)
    # QQP's release has rows to skip; no other GLUE release has
    allowed = 1.0 if spec.broken_rows else builder.MAX_SKIPPED_FRACTION
    builder.refuse_lossy(splits.reads, allowed if max_skipped_fraction is None else max_skipped_fraction)
    return splits


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
        options=("max_skipped_fraction",),
    )
    for name, spec in SPECS.items()
}
