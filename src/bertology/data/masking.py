"""Masked-LM corruption as a batch transform, vectorised over rows (no per-row Python).

Every strategy has the same two steps: choose which positions to predict, then corrupt them the
80/10/10 way (mask / random token / keep). `mask_tokens` chooses single tokens as BERT does;
whole-word or span masking only need a different first step feeding `_corrupt`.

The number of predictions per row follows BERT's create_pretraining_data.py:
`min(max_predictions, max(1, round(masked_lm_prob * n)))` with n the row's non-pad tokens,
[CLS] and [SEP] included (BERT's `len(tokens)`), and Python 3 rounding (half to even).
"""

from __future__ import annotations

from typing import Collection

import numpy as np

from bertology.errors import UserError


def mask_tokens(
    input_ids: np.ndarray,
    rng: np.random.Generator,
    *,
    vocab_size: int,
    mask_id: int,
    special_ids: Collection[int],
    max_predictions: int,
    masked_lm_prob: float = 0.15,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """BERT's token masking of a `(B, L)` batch.

    Ids in `special_ids` (which must hold pad_id) are never chosen. Returns `input_ids` (the
    corrupted copy, int32), `masked_positions` (ascending, 0-padded), `masked_ids` (the original
    ids there, 0-padded), both `(B, max_predictions)` int32, and `masked_weights` (1.0 real,
    0.0 padding) float32. Random replacements are uniform over the non-special ids below
    vocab_size.
    """
    ids = np.asarray(input_ids)
    special = np.unique(np.asarray(list(special_ids), dtype=np.int64))
    _check(ids, special, vocab_size, max_predictions, masked_lm_prob, mask_prob, random_prob, pad_id)
    candidate = ~np.isin(ids, special)
    n = np.count_nonzero(ids != pad_id, axis=1)
    count = np.minimum(max_predictions, np.maximum(1, np.rint(masked_lm_prob * n).astype(np.int64)))
    count = np.minimum(count, np.count_nonzero(candidate, axis=1))
    positions, weights = _choose_tokens(candidate, count, max_predictions, rng)
    return _corrupt(ids, positions, weights, rng, vocab_size=vocab_size, mask_id=mask_id, special=special,
                    mask_prob=mask_prob, random_prob=random_prob)


def _check(ids: np.ndarray, special: np.ndarray, vocab_size: int, max_predictions: int, masked_lm_prob: float,
           mask_prob: float, random_prob: float, pad_id: int) -> None:
    if ids.ndim != 2:
        raise UserError(f"input_ids has shape {ids.shape}; pass a (batch, length) array")
    if max_predictions < 1:
        raise UserError(f"max_predictions={max_predictions} allows no predictions; use at least 1")
    if not (0 <= masked_lm_prob <= 1 and 0 <= mask_prob and 0 <= random_prob and mask_prob + random_prob <= 1):
        raise UserError(f"masking rates (masked_lm_prob={masked_lm_prob}, mask_prob={mask_prob}, "
                        f"random_prob={random_prob}) are not probabilities; keep each in [0, 1] and mask+random <= 1")
    if pad_id not in special:
        raise UserError(f"pad_id {pad_id} is not in special_ids; include it so padding is never masked")
    if random_prob > 0 and np.count_nonzero(special < vocab_size) >= vocab_size:
        raise UserError(f"every id below vocab_size={vocab_size} is special, so no random token exists; "
                        "check vocab_size or set random_prob=0")


def _choose_tokens(candidate: np.ndarray, count: np.ndarray, max_predictions: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count[r]` candidate positions of row r, uniformly without replacement, as ascending
    `(B, max_predictions)` positions padded with 0 and their 0/1 weights.

    Random keys with non-candidates at +inf: the row's `count` smallest keys are a uniform sample.
    """
    rows, length = candidate.shape
    keys = np.where(candidate, rng.random((rows, length)), np.inf)
    width = min(max_predictions, length)
    if width < length:  # only the `width` smallest keys can be chosen
        smallest = np.argpartition(keys, width - 1, axis=1)[:, :width]
        order = np.take_along_axis(smallest, np.argsort(np.take_along_axis(keys, smallest, axis=1), axis=1), axis=1)
    else:
        order = np.argsort(keys, axis=1)
    chosen = np.arange(width) < count[:, None]
    positions = np.sort(np.where(chosen, order, length), axis=1)  # unchosen sort to the end
    positions = np.pad(positions, ((0, 0), (0, max_predictions - width)), constant_values=length)
    weights = positions < length
    return np.where(weights, positions, 0).astype(np.int32), weights


def _corrupt(ids: np.ndarray, positions: np.ndarray, weights: np.ndarray, rng: np.random.Generator, *,
             vocab_size: int, mask_id: int, special: np.ndarray, mask_prob: float,
             random_prob: float) -> dict[str, np.ndarray]:
    """The 80/10/10 step: each chosen position independently becomes mask_id with mask_prob, a
    random non-special id with random_prob, and otherwise keeps its token."""
    rows = np.arange(len(ids))[:, None]
    original = ids[rows, positions]
    allowed = np.setdiff1d(np.arange(vocab_size), special)
    u = rng.random(positions.shape)
    random_tokens = allowed[rng.integers(len(allowed), size=positions.shape)] if len(allowed) else original
    new = np.where(u < mask_prob, mask_id, np.where(u < mask_prob + random_prob, random_tokens, original))
    out = ids.astype(np.int32)  # a copy
    r, k = np.nonzero(weights)
    out[r, positions[r, k]] = new[r, k]
    return {
        "input_ids": out,
        "masked_positions": positions,
        "masked_ids": np.where(weights, original, 0).astype(np.int32),
        "masked_weights": weights.astype(np.float32),
    }
