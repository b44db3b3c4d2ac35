"""SQuAD v1.1 and v2.0 from the official JSON files (train-v1.1.json, dev-v1.1.json, ...).

One example per question: its context, the gold answer texts and character starts (every one,
for scoring: the dev sets have several per question; the first for training, as the reference
does) and, in v2.0, whether it is unanswerable. An unanswerable question's `plausible_answers`
are distractors written by the annotators, not answers: it keeps no answer. A file's `version`
must match the task (v1.1 has no unanswerable questions, so a v2.0 file would train on false
answers). An answerable question with no answer is skipped and counted, and so is a training
answer whose text is not found at its `answer_start` (the reference BERT skips those too); a
split left with no question is an error. Scoring is the official scripts' (bertology.evaluation.squad).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.errors import UserError
from bertology.evaluation import squad as squad_metrics
from bertology.tasks import Example, Task, builder, data_dir

FILES = {"v1.1": ("train-v1.1.json", "dev-v1.1.json"), "v2.0": ("train-v2.0.json", "dev-v2.0.json")}


def _questions(version: str, path: pathlib.Path) -> Iterator[tuple[dict, str, str]]:
    """(question, its context, its article title) for every question of the file."""
    try:
        doc = json.loads(builder.read_text(path))
        articles = doc["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a SQuAD JSON file ({e}); use the official release") from None
    found = str(doc.get("version", version)).removeprefix("v")
    if found != version.removeprefix("v"):
        other = "squad_v2" if found.startswith("2") else "squad_v1"
        raise UserError(f"{path} is SQuAD {doc['version']}, not {version}; use task {other} or the {version} files")
    try:
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    yield qa, paragraph["context"], article.get("title", "")
    except (KeyError, TypeError) as e:
        raise UserError(f"{path}: a SQuAD article, paragraph or question lacks {e}; use the official release") from None


def parse(version: str, path: pathlib.Path, split: str, read: builder.Read) -> Iterator[Example]:
    read.source = str(path)
    for qa, context, title in _questions(version, path):
        impossible = bool(qa.get("is_impossible", False))
        answers = [] if impossible else qa.get("answers", [])
        if not impossible and not answers:
            read.skip("answerable question without an answer")
            continue
        if split == "train" and answers:
            first = answers[0]
            start = int(first["answer_start"])
            if context[start:start + len(first["text"])] != first["text"]:
                read.skip("answer text not at its answer_start")
                continue
        yield {
            "id": qa["id"],
            "title": title,
            "context": context,
            "question": qa["question"],
            "answers": [a["text"] for a in answers],
            "answer_starts": [int(a["answer_start"]) for a in answers],
            "is_impossible": impossible,
        }


def _load(version: str, directory: str | None, cache_dir=None, log=print) -> dict[str, list[Example]]:
    root = data_dir(directory, "squad")
    hint = f"put the official SQuAD {version} JSON files there (or set --config.data.dir)"
    files = {split: builder.require(root / name, f"squad {version}", hint)
             for split, name in zip(("train", "validation"), FILES[version])}
    text = tfds.features.Text()
    features = {
        "id": text, "title": text, "context": text, "question": text,
        "answers": tfds.features.Sequence(text), "answer_starts": tfds.features.Sequence(np.int64),
        "is_impossible": np.bool_,
    }
    parsers = {split: functools.partial(parse, version, path, split) for split, path in files.items()}
    return builder.load(f"squad_{version}", features, parsers, list(files.values()), cache_dir, log)


def _score(version: str, examples: list[Example], predictions: dict[str, str]) -> dict[str, float]:
    gold = {e["id"]: ([] if e["is_impossible"] else e["answers"]) for e in examples}
    return {k: v for k, v in squad_metrics.evaluate(gold, predictions, version).items() if "total" not in k}


TASKS = {
    f"squad_{tag}": Task(
        name=f"squad_{tag}", kind="qa", labels=(), primary="f1",
        load=functools.partial(_load, version), score=functools.partial(_score, version), version=version,
    )
    for tag, version in (("v1", "v1.1"), ("v2", "v2.0"))
}
