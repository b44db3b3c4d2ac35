"""CoNLL-2003 English NER from the shared task's column files.

Each line is `word POS chunk NER`; a blank line ends a sentence and `-DOCSTART-` lines (`-DOCSTART-
-X- O O` in the original, `-DOCSTART- -X- -X- O` in re-releases) separate documents. The files are
the original eng.train / eng.testa / eng.testb or train.txt / valid.txt / test.txt (the names most
re-releases use). The original is tagged IOB1 (an entity starts with I-; B- only where it directly
follows one of its type), most re-releases IOB2 (every entity starts with B-). Both are read as
IOB2 (`evaluation.conll.to_iob2`), so the model learns one scheme whichever release it is given
and the count of retagged tokens is reported; the scorer follows conlleval, so gold tags in either
scheme score the same entities.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.errors import UserError
from bertology.evaluation import conll as conll_metrics
from bertology.tasks import Example, Task, builder, data_dir

LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
FILES = {"train": ("train.txt", "eng.train"), "validation": ("valid.txt", "eng.testa"), "test": ("test.txt", "eng.testb")}


def sentences(path: pathlib.Path, column: int = -1, layout: str = "word POS chunk NER",
              fix: str = "use the CoNLL-2003 column files") -> Iterator[tuple[int, list[str], list[str]]]:
    """(line number of its first word, words, tags) of each sentence of a CoNLL-style column file:
    the word first, the tag in `column`, blank lines between sentences, `-DOCSTART-` lines
    skipped. A line without that column is an error naming the `layout` expected and the `fix`."""
    words: list[str] = []
    tags: list[str] = []
    first = 0
    for line_no, line in enumerate([*builder.read_text(path).split("\n"), ""], 1):
        cols = line.split()
        if cols and cols[0] != "-DOCSTART-":
            if len(cols) < 2 or not -len(cols) <= column < len(cols):
                raise UserError(f"{path}:{line_no}: {line.strip()!r} is not '{layout}'; {fix}")
            first = first or line_no
            words.append(cols[0])
            tags.append(cols[column])
        elif words:
            yield first, words, tags
            first, words, tags = 0, [], []


def parse(path: pathlib.Path, read: builder.Read) -> Iterator[Example]:
    read.source = str(path)
    for n, (first, words, tags) in enumerate(sentences(path)):
        unknown = next((i for i, t in enumerate(tags) if t not in LABELS), None)
        if unknown is not None:
            raise UserError(f"{path}:{first + unknown}: unknown NER tag {tags[unknown]!r}; expected one of {LABELS}")
        iob2 = conll_metrics.to_iob2(tags)
        read.convert("IOB1 entity starts retagged B- (IOB2)", sum(a != b for a, b in zip(tags, iob2)))
        yield {"idx": n, "tokens": words, "tags": [LABELS.index(t) for t in iob2]}


def _find(root: pathlib.Path, split: str) -> pathlib.Path | None:
    return next((root / name for name in FILES[split] if (root / name).is_file()), None)


def _load(directory: str | None, cache_dir=None, log=print) -> dict[str, list[Example]]:
    root = data_dir(directory, "conll2003")
    files = {}
    for split in FILES:
        path = _find(root, split)
        if path is None and split != "test":
            path = builder.require(root / FILES[split][0], "conll2003",
                                   "put the CoNLL-2003 column files (train.txt, valid.txt, test.txt) there")
        if path is not None:
            files[split] = path
    features = {"idx": np.int64, "tokens": tfds.features.Sequence(tfds.features.Text()),
                "tags": tfds.features.Sequence(np.int64)}
    parsers = {split: functools.partial(parse, path) for split, path in files.items()}
    return builder.load("conll2003", features, parsers, list(files.values()), cache_dir, log)


def _score(examples: list[Example], predictions: list[list[str]]) -> dict[str, float]:
    gold = [[LABELS[t] for t in e["tags"]] for e in examples]
    out = conll_metrics.entity_scores(gold, predictions)
    return {k: out[k] for k in ("precision", "recall", "f1")}


TASKS = {
    "conll2003": Task(name="conll2003", kind="token", labels=LABELS, primary="f1", load=_load, score=_score,
                      eval_splits=("validation",)),
}
