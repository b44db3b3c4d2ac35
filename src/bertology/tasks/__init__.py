"""Downstream tasks by name: what to read, what kind of head it needs, how it is scored.

A `Task` ties a parser of the official local files (through the TFDS builder in
`tasks.builder`) to a head kind and to the metrics its leaderboard reports. Names are the
config's `task` values: the GLUE tasks (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli),
squad_v1, squad_v2, conll2003, swag, `embedded` and `long_range` (no download needed); the seq2seq tasks
seq2seq_jsonl, cnndm, xsum and `seq2seq_embedded` (no download needed); and tasks from your own
files, which the config's data block describes (`tasks.custom`): text_classification,
text_regression and token_tagging.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from typing import Any, Callable

from bertology.errors import UserError

Example = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str  # "seq2seq", or an entry of `kinds.KINDS`: picks the head, the loss and the input encoding
    labels: tuple[str, ...]  # class (or tag) names; () for regression and QA; choices: ("0".."3")
    primary: str  # the metric that summarises the task (sweeps and tables sort by it)
    # (data_dir, cache_dir, log, **options) -> builder.Splits: {split: examples}, and `.reads` {split: builder.Read}
    # saying how many rows of each file were kept, skipped and converted, and why; data_dir may be
    # None where none is needed
    load: Callable[..., dict[str, list[Example]]]
    # (examples of one split, predictions) -> {metric: value in percent}
    score: Callable[[list[Example], Any], dict[str, float]]
    eval_splits: tuple[str, ...] = ("validation",)
    # split -> submission file name, for the splits written in the leaderboard's format
    submissions: tuple[tuple[str, str], ...] = ()
    version: str = ""  # SQuAD: v1.1 or v2.0
    # keys of the run's `data` block that `load` takes as keyword arguments, where set: the settings of a
    # generated task (the long-range task's document length and class count)
    options: tuple[str, ...] = ()


# Task name -> the module of bertology.tasks that defines it (in its TASKS). Only that module is
# imported: the embedded task reads the whole standard library to learn its class names.
MODULES = {
    **dict.fromkeys(("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"), "glue"),
    "squad_v1": "squad", "squad_v2": "squad", "conll2003": "conll", "swag": "swag", "embedded": "embedded",
    "long_range": "long_range",
    **dict.fromkeys(("seq2seq_jsonl", "cnndm", "xsum", "seq2seq_embedded"), "seq2seq"),
    **dict.fromkeys(("text_classification", "text_regression", "token_tagging"), "custom"),
}


def get(name: str, data: Any = None) -> Task:
    """The task `name`; `data` is the run's data block, which a task from the user's own files
    (its module's TASKS entry is a builder, not a Task) is built from: files, columns, labels."""
    if name not in MODULES:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(sorted(MODULES))}")
    entry = importlib.import_module(f"bertology.tasks.{MODULES[name]}").TASKS[name]
    return entry if isinstance(entry, Task) else entry(name, data or {})


def data_dir(path: str | None, default: str) -> pathlib.Path:
    """The task's directory: `data.dir` if set, else `data/<default>` under the working directory."""
    return pathlib.Path(path or pathlib.Path("data") / default).expanduser()
