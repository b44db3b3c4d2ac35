"""A task's examples to arrays for the model, and the model's outputs back to task predictions.

`featurize` picks the encoding by head kind (pairs, words, choices, QA windows), in the layout of
data.cls_position / data.padding_side (`encode.Layout`); `predict`
turns stacked outputs into what the task's scorer and the submission writers take: class ids,
regression values, tag-name lists per sentence, or {question id: answer text}.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from bertology.data.tokenizers import Tokenizer
from bertology.tasks import Example, Task, encode, qa


@dataclasses.dataclass
class Features:
    arrays: dict[str, np.ndarray]  # one row per model input (a QA window, a sentence, ...)
    meta: Any = None  # QA: (windows, context token spans); token tagging: nothing else needed


def featurize(task: Task, examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict) -> Features:
    n, layout = data.max_seq_length, encode.Layout.from_config(data)
    if task.kind == "qa":
        arrays, windows, spans = qa.encode(tokenizer, examples, n, data.doc_stride, data.max_query_length, layout)
        return Features(arrays, (windows, spans))
    if task.kind == "token":
        rows = [encode.encode_words(tokenizer, e["tokens"], e["tags"], n, layout) for e in examples]
    elif task.kind == "choice":
        rows = [{**encode.encode_choices(tokenizer, e["context"], e["endings"], n, layout), "label": e["label"]}
                for e in examples]
    else:
        rows = [{**encode.encode_pair(tokenizer, e["text_a"], e["text_b"], n, layout), "label": e["label"]}
                for e in examples]
    arrays = encode.stack(rows)
    if task.kind == "regression":
        arrays["label"] = arrays["label"].astype(np.float32)
    return Features(arrays, None)


def predict(task: Task, examples: list[Example], features: Features, outputs: dict[str, np.ndarray],
            data: ml_collections.ConfigDict) -> Any:
    if task.kind == "qa":
        windows, spans = features.meta
        return qa.decode(
            examples, windows, spans, outputs["start_logits"], outputs["end_logits"],
            n_best=data.n_best_size, max_answer_length=data.max_answer_length,
            null_threshold=data.null_score_threshold if task.version == "v2.0" else None,
        )
    logits = outputs["logits"]
    if task.kind == "regression":
        return logits.astype(np.float64)
    if task.kind != "token":
        return logits.argmax(-1)
    tags = []
    for e, row_logits, word_index in zip(examples, logits, features.arrays["word_index"]):
        words = ["O"] * len(e["tokens"])  # words cut off by max_seq_length stay O
        for pos in np.flatnonzero(word_index >= 0):
            words[word_index[pos]] = task.labels[int(row_logits[pos].argmax())]
        tags.append(words)
    return tags
