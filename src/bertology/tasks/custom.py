"""Tasks from your own files: no code, only the config's `data.files`, `data.columns` and `data.labels`.

- `text_classification` / `text_regression`: one sentence or a sentence pair per row, a class
  (any label set: stance, veracity, SST-5) or a number, from CSV, TSV or JSON Lines;
- `token_tagging`: a tag per word from CoNLL-style column files, any tag set (POS, chunking, NER,
  word segmentation).

The format follows the file's suffix: `.csv` is read with Python's csv module (RFC 4180 quoting,
so a field may hold commas, quotes and line breaks); `.tsv` and `.txt` split on tabs and nothing
else, as GLUE's files are read (a `"` is text); `.jsonl`/`.json` hold one JSON object per line;
`.parquet`, `.arrow` and a directory `Dataset.save_to_disk` wrote are Hugging Face `datasets`
tables (`bertology.data.tables`; an error's number is then the row's). CSV and TSV files start
with a header naming their columns. `data.columns` names the ones to
read (`text`, optionally `pair`, and `label`; `tag` is the column number of a tagging file, -1
the last). `data.labels` lists the classes or tags in order ("against,none,favor"); unset, they
are the training file's own, sorted (numbers by value; for tags "O" first), and a label of
another split that the training file lacks is an error. The test file may lack the label column;
its predictions go to `submission/test_predictions.tsv`.

Bad files get the GLUE builders' one-line errors: a missing file or column, a label outside the
set, a regression value that is not a number, a line that is not JSON, each naming file and
line. A labelled row with an empty label is skipped and counted, and a file losing more than 1%
of its rows that way is refused (`data.max_skipped_fraction` allows more).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import math
import pathlib
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import sklearn.metrics
import tensorflow_datasets as tfds

from bertology.data import tables
from bertology.errors import UserError
from bertology.evaluation import classification as metrics
from bertology.evaluation import conll as conll_metrics
from bertology.tasks import Example, Task, builder
from bertology.tasks.conll import sentences

SPLITS = ("train", "validation", "test")
SUBMISSION = "test_predictions.tsv"


def _path(data: Mapping[str, Any], split: str, task: str) -> pathlib.Path | None:
    """The split's file (`data.files.<split>`); train and validation must be set and exist."""
    name = (data.get("files") or {}).get(split)
    if name is None:
        if split == "test":
            return None
        raise UserError(f"{task}: set --config.data.files.{split}=PATH (the {split} file: .csv, .tsv or .jsonl"
                        f"{', CoNLL columns' if task == 'token_tagging' else ''})")
    path = pathlib.Path(name).expanduser()
    return path if path.is_dir() else builder.require(path, task, f"set data.files.{split} to an existing file")


def rows(path: pathlib.Path) -> tuple[list[str] | None, Iterator[tuple[int, dict[str, Any]]]]:
    """(the header, None for JSON Lines; (line number, or row number in a table, {column: value})
    of each row) by suffix. A CSV or TSV row whose field count is not the header's becomes {}
    (skipped by the caller)."""
    suffix = path.suffix.lower()
    if tables.is_table(path):
        table = tables.read(path)
        return table.column_names, enumerate(table.to_pylist(), 1)
    text = builder.read_text(path)
    if suffix in (".jsonl", ".json"):
        return None, _json_rows(path, text)
    if suffix == ".csv":
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, [])
        return header, ((reader.line_num, dict(zip(header, r)) if len(r) == len(header) else {})
                        for r in reader if r)
    if suffix in (".tsv", ".txt"):
        lines = text.split("\n")
        header = lines[0].rstrip("\r").split("\t") if lines else []
        fields = ((n, line.rstrip("\r").split("\t")) for n, line in enumerate(lines[1:], 2) if line.strip())
        return header, ((n, dict(zip(header, f)) if len(f) == len(header) else {}) for n, f in fields)
    raise UserError(f"{path}: unknown file type {path.suffix!r}; use .csv, .tsv (or .txt), .jsonl, .parquet or .arrow")


def _json_rows(path: pathlib.Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not a JSON object ({e.msg}); write one object per line") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: not a JSON object; write one object per line")
        yield n, row


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def _sorted(labels: set[str]) -> tuple[str, ...]:
    """Numbers by value, else alphabetically; "O" (outside any entity) first."""
    try:
        ordered = sorted(labels, key=float)
    except ValueError:
        ordered = sorted(labels)
    return tuple(sorted(ordered, key=lambda label: label != "O"))


class Columns:
    """The columns `data.columns` names, checked against one file's header."""

    def __init__(self, data: Mapping[str, Any], regression: bool):
        columns = dict(data.get("columns") or {})
        self.text, self.pair, self.label = columns.get("text") or "text", columns.get("pair"), columns.get("label") or "label"
        self.regression = regression

    def check(self, path: pathlib.Path, header: list[str] | None, labelled: bool) -> None:
        needed = [c for c in (self.text, self.pair) if c] + ([self.label] if labelled else [])
        if header is not None and (missing := [c for c in needed if c not in header]):
            raise UserError(f"{path}:1: the header lacks column(s) {missing} (it has {header}); name the columns "
                            "with --config.data.columns.text/pair/label")

    def label_of(self, row: dict[str, Any]) -> str | None:
        value = row.get(self.label)
        return None if value is None or _text(value).strip() == "" else _text(value).strip()


def _training_labels(path: pathlib.Path, columns: Columns) -> set[str]:
    header, read = rows(path)
    columns.check(path, header, labelled=True)
    return {label for _, row in read if row and (label := columns.label_of(row)) is not None}


def _parse_text(path: pathlib.Path, split: str, read: builder.Read, *, columns: Columns,
                labels: tuple[str, ...]) -> Iterator[Example]:
    """Examples {idx: the row's number, text_a, text_b, label: the class's index or the value};
    -1 where a test row has no label."""
    read.source = str(path)
    header, found = rows(path)
    labelled = split != "test"
    columns.check(path, header, labelled)
    for idx, (line, row) in enumerate(found):
        if not row:
            read.skip("fields not the header's", line)
            continue
        if missing := [c for c in (columns.text, columns.pair) if c and c not in row]:  # a JSON line
            raise UserError(f"{path}:{line}: no {missing} key (it has {sorted(row)}); name the fields with "
                            "--config.data.columns.text/pair/label")
        raw = columns.label_of(row)
        if raw is None and labelled:
            read.skip("no label", line)
            continue
        yield {"idx": idx, "text_a": _text(row[columns.text]), "text_b": _text(row[columns.pair]) if columns.pair else "",
               "label": _value(raw, columns.regression, labels, path, line)}


def _value(raw: str | None, regression: bool, labels: tuple[str, ...], path: pathlib.Path, line: int) -> float | int:
    if raw is None:
        return -1.0 if regression else -1
    if regression:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise UserError(f"{path}:{line}: label {raw!r} is not a number; a regression task needs one in every row")
        return value
    if raw not in labels:
        raise UserError(f"{path}:{line}: label {raw!r} is not one of {list(labels)}; fix the row, or list every "
                        "label in --config.data.labels=a,b,c")
    return labels.index(raw)


def _parse_tags(path: pathlib.Path, column: int, labels: tuple[str, ...], read: builder.Read) -> Iterator[Example]:
    read.source = str(path)
    for n, (first, words, tags) in enumerate(_sentences(path, column)):
        unknown = next((i for i, t in enumerate(tags) if t not in labels), None)
        if unknown is not None:
            raise UserError(f"{path}:{first + unknown}: tag {tags[unknown]!r} is not one of {list(labels)}; fix the "
                            "line, or list every tag in --config.data.labels=A,B,C")
        yield {"idx": n, "tokens": words, "tags": [labels.index(t) for t in tags]}


def _sentences(path: pathlib.Path, column: int) -> Iterator[tuple[int, list[str], list[str]]]:
    return sentences(path, column, layout="word ... tag" if column < 0 else f"word ... (tag in column {column})",
                     fix="one word per line, its tag in data.columns.tag, a blank line between sentences")


def _labels(data: Mapping[str, Any], found: Callable[[], Iterable[str]]) -> tuple[str, ...]:
    """`data.labels` in order, else the training file's (`found()`, read only then), sorted."""
    given = data.get("labels")
    if given:
        return tuple(w.strip() for w in (given.split(",") if isinstance(given, str) else given))
    return _sorted(set(found()))


def _loader(task: str, files: dict[str, pathlib.Path], parse: Any, features: dict[str, Any], key: str,
            directory: Any = None, cache_dir: Any = None, log: Any = print,
            max_skipped_fraction: float | None = None) -> builder.Splits:
    """`Task.load` for files the config names (so `directory`, `data.dir`, is not read); `key`
    (the columns and labels) joins the files' identity in the parsed cache's name."""
    parsers: dict[str, builder.Parser] = {split: functools.partial(parse, path, split) for split, path in files.items()}
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    sources = [f for path in files.values() for f in (tables.shards(path) if tables.is_table(path) else [path])]
    splits = builder.load(f"{task}_{digest}", features, parsers, sources, cache_dir, log)
    builder.refuse_lossy(splits.reads, builder.MAX_SKIPPED_FRACTION if max_skipped_fraction is None else max_skipped_fraction)
    return splits


def _score_classes(labels: tuple[str, ...], examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    gold = np.array([e["label"] for e in examples])
    return {"accuracy": 100 * metrics.accuracy(predictions, gold),
            "macro_f1": 100 * float(sklearn.metrics.f1_score(gold, predictions, labels=range(len(labels)), average="macro",
                                                             zero_division=0))}


def _score_values(examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    gold = np.array([e["label"] for e in examples])
    return {"pearson": 100 * metrics.pearson(predictions, gold), "spearman": 100 * metrics.spearman(predictions, gold)}


def _entities(labels: tuple[str, ...]) -> bool:
    """The tags are BIO (O, B-X, I-X, ...): score entities as conlleval does."""
    return all(t == "O" or t[:2] in ("B-", "I-") for t in labels) and any(t != "O" for t in labels)


def _score_tags(labels: tuple[str, ...], examples: list[Example], predictions: list[list[str]]) -> dict[str, float]:
    gold = [[labels[t] for t in e["tags"]] for e in examples]
    pairs = [(g, p) for gs, ps in zip(gold, predictions) for g, p in zip(gs, ps)]
    out = {"accuracy": 100 * sum(g == p for g, p in pairs) / max(len(pairs), 1)}
    if _entities(labels):
        scores = conll_metrics.entity_scores(gold, predictions)
        out.update({k: scores[k] for k in ("precision", "recall", "f1")})
    return out


def _text_task(name: str, data: Mapping[str, Any]) -> Task:
    regression = name == "text_regression"
    files = {s: p for s in SPLITS if (p := _path(data, s, name)) is not None}
    columns = Columns(data, regression)
    labels = () if regression else _labels(data, lambda: _training_labels(files["train"], columns))
    if not regression and len(labels) < 2:
        raise UserError(f"{name}: the training file has {len(labels)} label(s) {list(labels)}; a classifier needs two "
                        "or more (set data.labels, or use text_regression for numbers)")
    features = {"idx": np.int64, "text_a": tfds.features.Text(), "text_b": tfds.features.Text(),
                "label": np.float32 if regression else np.int64}
    key = json.dumps([name, columns.text, columns.pair, columns.label, labels])
    parse = functools.partial(_parse_text, columns=columns, labels=labels)
    return Task(name=name, kind="regression" if regression else "classification", labels=labels,
                primary="spearman" if regression else "accuracy",
                load=functools.partial(_loader, name, files, parse, features, key),
                score=_score_values if regression else functools.partial(_score_classes, labels),
                submissions=(("test", SUBMISSION),) if "test" in files else (), options=("max_skipped_fraction",))


def _tagging_task(name: str, data: Mapping[str, Any]) -> Task:
    files = {s: p for s in SPLITS if (p := _path(data, s, name)) is not None}
    column = int((data.get("columns") or {}).get("tag", -1))
    labels = _labels(data, lambda: (t for _, _, tags in _sentences(files["train"], column) for t in tags))
    features = {"idx": np.int64, "tokens": tfds.features.Sequence(tfds.features.Text()),
                "tags": tfds.features.Sequence(np.int64)}

    def parse(path: pathlib.Path, split: str, read: builder.Read) -> Iterator[Example]:
        return _parse_tags(path, column, labels, read)  # every split alike

    return Task(name=name, kind="token", labels=labels, primary="f1" if _entities(labels) else "accuracy",
                load=functools.partial(_loader, name, files, parse, features, json.dumps([name, column, labels])),
                score=functools.partial(_score_tags, labels), options=("max_skipped_fraction",))


# name -> (name, the config's data block) -> the Task over its files, columns and labels (`tasks.get`)
TASKS = {"text_classification": _text_task, "text_regression": _text_task, "token_tagging": _tagging_task}
