"""GLUE's metrics: accuracy, binary F1, Matthews correlation, Pearson and Spearman.

GLUE reports CoLA as Matthews correlation, MRPC and QQP as F1 of the positive class (and
accuracy), STS-B as Pearson and Spearman correlation, and the rest as accuracy. Written in numpy
so no scikit-learn or scipy is needed; the formulas are the ones those libraries use.
"""

from __future__ import annotations

import numpy as np


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def f1_binary(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """F1 of the positive class; 0 when there is no true or predicted positive (as scikit-learn)."""
    p, y = np.asarray(predictions) == positive, np.asarray(labels) == positive
    tp = np.sum(p & y)
    denom = p.sum() + y.sum()
    return float(2 * tp / denom) if denom else 0.0


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation from the confusion matrix (Gorodkin's multiclass form; for two classes
    it is (tp·tn − fp·fn)/√((tp+fp)(tp+fn)(tn+fp)(tn+fn))). 0 when a marginal is constant."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    classes = np.union1d(predictions, labels)
    t = np.array([np.sum(labels == c) for c in classes], np.float64)
    p = np.array([np.sum(predictions == c) for c in classes], np.float64)
    correct, n = float(np.sum(predictions == labels)), float(len(labels))
    cov = correct * n - t @ p
    denom = np.sqrt((n * n - p @ p) * (n * n - t @ t))
    return float(cov / denom) if denom else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, np.float64) - np.mean(x), np.asarray(y, np.float64) - np.mean(y)
    denom = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denom) if denom else 0.0


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (scipy's rankdata 'average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Group boundaries of equal values; every member of a group gets the mean of its positions.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    average = (starts + ends + 1) / 2.0
    out = np.empty(len(x), np.float64)
    out[order] = np.repeat(average, ends - starts)
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of the tie-averaged ranks."""
    return pearson(ranks(x), ranks(y))
