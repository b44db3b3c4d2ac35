"""The embedded downstream task: which standard-library package does a docstring sentence come from?

It needs no download and has real labels. The embedded pretraining corpus (bertology.data.embedded)
is one document per stdlib module, in sorted path order; here the same sentences are labelled
with the top-level package of their module (`asyncio/events.py` -> asyncio), keeping the
`NUM_CLASSES` packages with the most sentences. Each class is thinned evenly to `PER_CLASS`
sentences, so chance is 1/NUM_CLASSES; a sentence found in two packages is dropped. Within a
class, every 10th sentence goes to validation and the one after it to test. The classes depend on
the installed Python (3.11: tkinter, asyncio, email, distutils, importlib, logging, xml, unittest).

The sentences are also in the pretraining corpus (their labels never are), as in-domain
pretraining text is for GLUE-style tasks in practice.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import tensorflow_datasets as tfds

from bertology.data import embedded as corpus
from bertology.evaluation import classification as metrics
from bertology.tasks import Example, Task, builder

NUM_CLASSES = 8
PER_CLASS = 400


@functools.lru_cache(maxsize=1)
def labelled_sentences() -> tuple[tuple[str, ...], dict[str, list[str]]]:
    """(class names, {package: its sentences}) after thinning and de-duplication."""
    by_package: dict[str, list[str]] = collections.defaultdict(list)
    for module, sentences in corpus.stdlib_sentences().items():
        parts = module.split("/")
        if len(parts) >= 2 and len(sentences) >= 2:  # a module in a package, kept in the corpus
            by_package[parts[0]] += sentences
    owners: dict[str, set[str]] = collections.defaultdict(set)
    for package, sentences in by_package.items():
        for s in sentences:
            owners[s].add(package)
    unique = {p: list(dict.fromkeys(s for s in ss if len(owners[s]) == 1)) for p, ss in by_package.items()}
    classes = tuple(sorted(unique, key=lambda p: (-len(unique[p]), p))[:NUM_CLASSES])
    thinned = {}
    for package in classes:
        sentences = unique[package]
        keep = np.unique(np.linspace(0, len(sentences) - 1, min(PER_CLASS, len(sentences))).round().astype(int))
        thinned[package] = [sentences[i] for i in keep]
    return classes, thinned


def _split_of(i: int) -> str:
    return {8: "validation", 9: "test"}.get(i % 10, "train")


def _parse(split: str, read: builder.Read):
    read.source = str(corpus.stdlib_root())
    classes, sentences = labelled_sentences()
    n = 0
    for label, package in enumerate(classes):
        for i, s in enumerate(sentences[package]):
            if _split_of(i) == split:
                yield {"idx": n, "text_a": s, "text_b": "", "label": label}
                n += 1


def _load(directory: str | None = None, cache_dir=None, log=print) -> dict[str, list[Example]]:
    del directory  # built from the installed standard library
    root = corpus.stdlib_root()
    features = {"idx": np.int64, "text_a": tfds.features.Text(), "text_b": tfds.features.Text(), "label": np.int64}
    parsers = {split: functools.partial(_parse, split) for split in ("train", "validation", "test")}
    files = corpus.stdlib_sources(root)
    return builder.load("embedded", features, parsers, files, cache_dir, log)


def _score(examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    return {"accuracy": 100 * metrics.accuracy(predictions, [e["label"] for e in examples])}


TASKS = {
    "embedded": Task(
        name="embedded", kind="classification", labels=labelled_sentences()[0],
        primary="accuracy", load=_load, score=_score,
    )
}
