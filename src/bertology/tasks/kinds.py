"""The head kinds of the encoder tasks, one table entry each.

An entry says everything fine-tuning does differently for its kind: how examples become rows (in
the layout of data.cls_position / data.padding_side, `encode.Layout`), what the head reads and
returns, the loss, how the outputs become what the task's scorer takes (class ids, regression
values, tag lists per sentence, {question id: answer text}), and which files the predictions
are written to. `TaskModel`, the `finetune` objective and the driver read the entry; none of them
asks which kind it runs, so a new kind is a new entry. (A seq2seq task trains a whole
encoder-decoder and decodes, so it has a driver of its own: `train.finetune.finetune_seq2seq`.)
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError
from bertology.evaluation import outputs as files
from bertology.objectives import Mean, Terms
from bertology.tasks import Example, Task, encode, qa

Array = jax.Array


@dataclasses.dataclass
class Features:
    arrays: dict[str, np.ndarray]  # one row per model input (a QA window, a sentence, ...)
    meta: Any = None  # QA: (windows, context token spans); the other kinds need nothing else


@dataclasses.dataclass(frozen=True)
class Kind:
    """One head kind (see the module docstring); the callables' arguments are named in `featurize`,
    `predict` and `write` below and in `TaskModel`."""

    encode: Callable[[list[Example], Tokenizer, ml_collections.ConfigDict, encode.Layout], Features]
    loss: Callable[[dict[str, Array], dict[str, Array]], Terms]
    predict: Callable[[Task, list[Example], Features, dict[str, np.ndarray], ml_collections.ConfigDict], Any]
    per_token: bool = False  # the head reads every position's state, not the pooled one
    dropout: bool = True  # dropout on what the head reads (BERT's QA head has none)
    choices: bool = False  # rows are [batch, choices, length]: one score per choice
    width: Callable[[Task], int] = lambda task: len(task.labels)  # the head's outputs per row (or position)
    outputs: Callable[[Array], dict[str, Array]] = lambda logits: {"logits": logits}
    # (task, its splits, {split: predictions}, workdir): the leaderboard files
    write: Callable[[Task, dict[str, list[Example]], dict[str, Any], pathlib.Path], None] = lambda *_: None


def _rows(rows: list[dict[str, Any]]) -> Features:
    return Features(encode.stack(rows))


def _pairs(examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict,
           layout: encode.Layout) -> Features:
    """One row per example; with `data.both_orders`, two: the pair as given and swapped ([n, 2,
    length]), which the task model reads as one (GPT-1's similarity input: `TaskModel`)."""
    def encoded(a: str, b: str) -> dict[str, np.ndarray]:
        return encode.encode_pair(tokenizer, a, b, data.max_seq_length, layout)

    if not data.get("both_orders"):
        return _rows([{**encoded(e["text_a"], e["text_b"]), "label": e["label"]} for e in examples])
    if examples and not any(e["text_b"] for e in examples):
        raise UserError("data.both_orders reads sentence pairs in both orders, and this task has single sentences; "
                        "set data.both_orders=False")
    return _rows([{**encode.stack([encoded(e["text_a"], e["text_b"]), encoded(e["text_b"], e["text_a"])]),
                   "label": e["label"]} for e in examples])


def _scored_pairs(examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict,
                  layout: encode.Layout) -> Features:
    """Pairs with a float label (the loss is the squared error)."""
    feats = _pairs(examples, tokenizer, data, layout)
    feats.arrays["label"] = feats.arrays["label"].astype(np.float32)
    return feats


def _words(examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict,
           layout: encode.Layout) -> Features:
    return _rows([encode.encode_words(tokenizer, e["tokens"], e["tags"], data.max_seq_length, layout)
                  for e in examples])


def _choices(examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict,
             layout: encode.Layout) -> Features:
    return _rows([{**encode.encode_choices(tokenizer, e["context"], e["endings"], data.max_seq_length, layout),
                   "label": e["label"]} for e in examples])


def _windows(examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict,
             layout: encode.Layout) -> Features:
    arrays, windows, spans = qa.encode(tokenizer, examples, data.max_seq_length, data.doc_stride,
                                       data.max_query_length, layout)
    return Features(arrays, (windows, spans))


def _cross_entropy(logits: Array, labels: Array, weights: Array | None = None) -> tuple[Array, Array, Array]:
    """(per-position losses, per-position correctness, weights): positions with weight 0 are ignored."""
    w = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
    safe = jnp.maximum(labels, 0)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
    return nll, jnp.argmax(logits, axis=-1) == safe, w


def _terms(nll: Array, correct: Array, w: Array) -> Terms:
    return Terms(loss={"cross_entropy": 1.0}, means={"cross_entropy": Mean.of(nll, w), "accuracy": Mean.of(correct, w)})


def _label_loss(out: dict[str, Array], batch: dict[str, Array]) -> Terms:
    return _terms(*_cross_entropy(out["logits"], batch["label"]))


def _tag_loss(out: dict[str, Array], batch: dict[str, Array]) -> Terms:
    """Only where `labels` >= 0: each word's first sub-word."""
    return _terms(*_cross_entropy(out["logits"], batch["labels"], batch["labels"] >= 0))


def _span_loss(out: dict[str, Array], batch: dict[str, Array]) -> Terms:
    """The mean of the start and end cross-entropies, as the reference BERT: one mean over the
    2·rows boundary predictions."""
    parts = [_cross_entropy(out[f"{end}_logits"], batch[f"{end}_position"]) for end in ("start", "end")]
    return _terms(*(jnp.stack(x) for x in zip(*parts)))


def _squared_error(out: dict[str, Array], batch: dict[str, Array]) -> Terms:
    return Terms(loss={"mse": 1.0}, means={"mse": Mean.of(jnp.square(out["logits"] - batch["label"]))})


def _argmax(task: Task, examples: list[Example], features: Features, out: dict[str, np.ndarray],
            data: ml_collections.ConfigDict) -> np.ndarray:
    return out["logits"].argmax(-1)


def _values(task: Task, examples: list[Example], features: Features, out: dict[str, np.ndarray],
            data: ml_collections.ConfigDict) -> np.ndarray:
    return out["logits"].astype(np.float64)


def _tags(task: Task, examples: list[Example], features: Features, out: dict[str, np.ndarray],
          data: ml_collections.ConfigDict) -> list[list[str]]:
    """Each word's tag from its first sub-word; words cut off by max_seq_length get the first tag
    (NER's O: outside any entity)."""
    tags = []
    for e, row_logits, word_index in zip(examples, out["logits"], features.arrays["word_index"]):
        words = [task.labels[0]] * len(e["tokens"])
        for pos in np.flatnonzero(word_index >= 0):
            words[word_index[pos]] = task.labels[int(row_logits[pos].argmax())]
        tags.append(words)
    return tags


def _answers(task: Task, examples: list[Example], features: Features, out: dict[str, np.ndarray],
             data: ml_collections.ConfigDict) -> dict[str, str]:
    windows, spans = features.meta
    return qa.decode(examples, windows, spans, out["start_logits"], out["end_logits"], n_best=data.n_best_size,
                     max_answer_length=data.max_answer_length,
                     null_threshold=data.null_score_threshold if task.version == "v2.0" else None)


def _glue_tsv(label: Callable[[Task, Any], Any]) -> Callable[..., None]:
    """GLUE's submission TSVs for the task's test splits present, each prediction as `label` writes it."""
    def write(task: Task, splits: dict[str, list[Example]], predictions: dict[str, Any], workdir: pathlib.Path) -> None:
        for split, name in task.submissions:
            if split in predictions:
                files.write_glue_tsv(workdir / "submission" / name, [e["idx"] for e in splits[split]],
                                     [label(task, p) for p in predictions[split]])
    return write


def _squad_json(task: Task, splits: dict[str, list[Example]], predictions: dict[str, Any], workdir: pathlib.Path) -> None:
    for split, preds in predictions.items():
        files.write_squad_json(workdir / f"predictions_{split}.json", preds)


def _one(task: Task) -> int:
    return 1


KINDS: dict[str, Kind] = {
    "classification": Kind(_pairs, _label_loss, _argmax,
                           write=_glue_tsv(lambda task, p: task.labels[int(p)])),
    "regression": Kind(_scored_pairs, _squared_error, _values, width=_one,
                       outputs=lambda logits: {"logits": logits[:, 0]}, write=_glue_tsv(lambda task, p: float(p))),
    "token": Kind(_words, _tag_loss, _tags, per_token=True),
    "qa": Kind(_windows, _span_loss, _answers, per_token=True, dropout=False, width=lambda task: 2,
               outputs=lambda logits: {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}, write=_squad_json),
    "choice": Kind(_choices, _label_loss, _argmax, choices=True, width=_one),
}


def of(task_kind: str) -> Kind:
    if task_kind not in KINDS:
        raise UserError(f"task kind {task_kind!r} has no encoder head; use one of {', '.join(KINDS)}")
    return KINDS[task_kind]


def featurize(task: Task, examples: list[Example], tokenizer: Tokenizer, data: ml_collections.ConfigDict) -> Features:
    """The model's rows for `examples`."""
    return of(task.kind).encode(examples, tokenizer, data, encode.Layout.from_config(data))


def predict(task: Task, examples: list[Example], features: Features, out: dict[str, np.ndarray],
            data: ml_collections.ConfigDict) -> Any:
    """What the task's scorer and the submission writers take, from the stacked outputs."""
    return of(task.kind).predict(task, examples, features, out, data)


def write(task: Task, splits: dict[str, list[Example]], predictions: dict[str, Any], workdir: pathlib.Path) -> None:
    """The leaderboard files: GLUE TSVs for the test splits present, SQuAD JSON for every QA split."""
    of(task.kind).write(task, splits, predictions, workdir)
