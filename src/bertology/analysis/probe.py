"""Probing classifiers: what a linear classifier can read off each layer's frozen vectors.

A probe per layer of the trunk fine-tuning uses (`bertology.features.layer_states`; 0 is the
embedding output) is trained on one file and scored on another:
- token tasks (part of speech, chunks, entities: any tag set) from CoNLL-style column files, the
  word first and the tag in `column`; a word's vector is its first sub-word piece's, as token
  tagging reads it (Tenney et al. 2019 and Liu et al. 2019 probe layers the same way);
- sentence tasks from a TSV file with a header, the text and the label in named columns; a
  sentence's vector is the mean over its real tokens (a causal trunk's: its last token), as
  `bertology.features` gives it.

The probe is multinomial logistic regression (scikit-learn's, on standardised vectors): linear,
so it measures what the layer makes linearly available rather than what a deep probe could
compute. For token tasks each layer also gets Hewitt & Liang's (2019) control task: every word
type is given a random tag (drawn with the task's tag frequencies, the same for every
occurrence), and the same probe is trained on it. `selectivity` = accuracy - control accuracy
is what the layer encodes about the task beyond memorising word identities; a probe that is
accurate but not selective says more about the probe than about the layer.
"""

from __future__ import annotations

import csv
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertology.analysis.plots import pyplot, save
from bertology.errors import UserError

KINDS = ("tokens", "sentences")


def read_tokens(path: pathlib.Path, column: int) -> tuple[list[list[str]], list[list[str]]]:
    """(sentences as words, their tags) of a CoNLL-style column file."""
    from bertology.tasks.conll import sentences

    layout = f"word ... tag (tag in column {column})"
    rows = [(words, tags) for _, words, tags in sentences(path, column, layout,
                                                          "give a column file with the word first, or fix --column")]
    if not rows:
        raise UserError(f"{path} holds no tagged words; give a CoNLL-style column file (one word per line)")
    return [w for w, _ in rows], [t for _, t in rows]


def read_sentences(path: pathlib.Path, text_column: str, label_column: str) -> tuple[list[str], list[str]]:
    """(texts, labels) of a TSV file with a header naming the two columns."""
    if not path.is_file():
        raise UserError(f"{path} not found; give a TSV file with a header")
    with open(path, encoding="utf-8", newline="") as f:
        table = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in (text_column, label_column) if c not in (table.fieldnames or [])]
        if missing:
            raise UserError(f"{path}:1: the header lacks column(s) {missing} (it has {table.fieldnames}); "
                            "name them with --text_column and --label_column")
        rows = [(r[text_column].strip(), r[label_column].strip()) for r in table if r[text_column] and r[label_column]]
    if not rows:
        raise UserError(f"{path} has no rows with both {text_column!r} and {label_column!r}")
    return [t for t, _ in rows], [label for _, label in rows]


def vectors(checkpoint: str | pathlib.Path, kind: str, inputs: Sequence[Any], labels: Sequence[Any],
            max_seq_length: int) -> tuple[np.ndarray, list[str], list[str]]:
    """(vectors [layers, examples, H], their labels, the words they are of (token tasks; else
    the texts)). A token task's words cut off at max_seq_length are left out."""
    from bertology.features import layer_states

    states = layer_states(checkpoint, inputs, max_seq_length=max_seq_length)
    if kind == "tokens":
        row, pos = np.nonzero(states["word_index"] >= 0)
        at = list(zip(row.tolist(), states["word_index"][row, pos].tolist()))  # (sentence, word) of each vector
        return (np.moveaxis(states["layers"][row, :, pos], 0, 1), [labels[r][w] for r, w in at],
                [inputs[r][w] for r, w in at])
    return np.moveaxis(states["sentence"], 0, 1), list(labels), list(inputs)


def control_tags(words: Sequence[str], tags: Sequence[str], seed: int = 0) -> list[str]:
    """Hewitt & Liang's control task: one random tag per word type (drawn from the tags' own
    frequencies), given to every occurrence of the type."""
    rng = np.random.default_rng(seed)
    names, counts = np.unique(np.asarray(tags), return_counts=True)
    types = sorted(set(words))
    drawn = dict(zip(types, rng.choice(names, size=len(types), p=counts / counts.sum())))
    return [str(drawn[w]) for w in words]


def fit_and_score(train: np.ndarray, train_labels: Sequence[str], test: np.ndarray, test_labels: Sequence[str],
                  seed: int = 0) -> float:
    """Held-out accuracy of logistic regression on standardised vectors (scikit-learn)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(set(train_labels)) < 2:
        return float(np.mean(np.asarray(test_labels) == train_labels[0]))
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    probe.fit(train, list(train_labels))
    return float(probe.score(test, list(test_labels)))


def accuracy_by_layer(checkpoint: str | pathlib.Path, kind: str, train: tuple[Sequence[Any], Sequence[Any]],
                      test: tuple[Sequence[Any], Sequence[Any]], *, max_seq_length: int = 128,
                      seed: int = 0) -> dict[str, Any]:
    """{'kind', 'train_examples', 'test_examples', 'labels', 'majority' (the most frequent train
    label's test accuracy), 'layers': [{'layer', 'accuracy'[, 'control', 'selectivity']}]}.
    `train` and `test` are (inputs, labels): sentences as words with a tag per word (tokens), or
    texts with a label each (sentences)."""
    if kind not in KINDS:
        raise UserError(f"probe kind {kind!r}; use one of {KINDS}")
    x_train, y_train, w_train = vectors(checkpoint, kind, *train, max_seq_length)
    x_test, y_test, w_test = vectors(checkpoint, kind, *test, max_seq_length)
    unseen = sorted(set(y_test) - set(y_train))
    if unseen:
        raise UserError(f"test label(s) {unseen[:5]} never occur in the training file; a probe cannot predict "
                        "them: give a training file with every label")
    labels = sorted(set(y_train))
    majority = max(labels, key=list(y_train).count)
    result: dict[str, Any] = {"kind": kind, "train_examples": len(y_train), "test_examples": len(y_test),
                              "labels": labels, "majority": float(np.mean(np.asarray(y_test) == majority)), "layers": []}
    if kind == "tokens":  # one random tag per word type, the same in both files
        control = control_tags(w_train + w_test, y_train + y_test, seed)
        c_train, c_test = control[:len(w_train)], control[len(w_train):]
    for layer in range(x_train.shape[0]):
        row = {"layer": layer, "accuracy": fit_and_score(x_train[layer], y_train, x_test[layer], y_test, seed)}
        if kind == "tokens":
            row["control"] = fit_and_score(x_train[layer], c_train, x_test[layer], c_test, seed)
            row["selectivity"] = row["accuracy"] - row["control"]
        result["layers"].append(row)
    return result


def plot(result: dict[str, Any], title: str, path: pathlib.Path) -> None:
    """Held-out accuracy by layer, with the control task's and the majority label's."""
    plt = pyplot()
    layers = [r["layer"] for r in result["layers"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(layers, [r["accuracy"] for r in result["layers"]], marker="o", label="probe")
    if result["kind"] == "tokens":
        ax.plot(layers, [r["control"] for r in result["layers"]], marker="o", label="control task (random tag per word)")
    ax.axhline(result["majority"], color="grey", linestyle="--", label="majority label")
    ax.set_xticks(layers)
    ax.set_xlabel("layer (0: embeddings)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(fontsize="small")
    save(fig, path)
