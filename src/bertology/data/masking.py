"""Masked-LM corruption as a batch transform, vectorised over rows (no per-row Python).

Every strategy has the same two steps: choose which positions to predict, then corrupt them the
80/10/10 way (mask / random token / keep). `mask_tokens` chooses single tokens as BERT does;
whole-word or span masking only need a different first step feeding `corrupt`. `prepare` and
`corrupt` are public for the strategies written elsewhere (UniLM's n-grams and fine-tuning targets).

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
    ids, special, candidate, count = prepare(input_ids, special_ids, vocab_size, max_predictions, masked_lm_prob,
                                             mask_prob, random_prob, pad_id)
    count = np.minimum(count, np.count_nonzero(candidate, axis=1))
    positions, weights = _choose_tokens(candidate, count, max_predictions, rng)
    return corrupt(ids, positions, weights, rng, vocab_size=vocab_size, mask_id=mask_id, special=special,
                   mask_prob=mask_prob, random_prob=random_prob)


def prepare(input_ids: np.ndarray, special_ids: Collection[int], vocab_size: int, max_predictions: int,
            masked_lm_prob: float, mask_prob: float, random_prob: float,
            pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Checked inputs: (ids, sorted special ids, maskable-token mask, per-row prediction budget
    min(max_predictions, max(1, round(masked_lm_prob · non-pad tokens))))."""
    ids = np.asarray(input_ids)
    special = np.unique(np.asarray(list(special_ids), dtype=np.int64))
    _check(ids, special, vocab_size, max_predictions, masked_lm_prob, mask_prob, random_prob, pad_id)
    n = np.count_nonzero(ids != pad_id, axis=1)
    budget = np.minimum(max_predictions, np.maximum(1, np.rint(masked_lm_prob * n).astype(np.int64)))
    return ids, special, ~np.isin(ids, special), budget


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


def corrupt(ids: np.ndarray, positions: np.ndarray, weights: np.ndarray, rng: np.random.Generator, *,
            vocab_size: int, mask_id: int, special: np.ndarray, mask_prob: float,
            random_prob: float, u: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The 80/10/10 step: each chosen position independently becomes mask_id with mask_prob, a
    random non-special id with random_prob, and otherwise keeps its token. Passing `u` (one
    uniform per position, equal within a span) makes the decision per span instead (SpanBERT)."""
    rows = np.arange(len(ids))[:, None]
    original = ids[rows, positions]
    allowed = np.setdiff1d(np.arange(vocab_size), special)
    if u is None:
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


UNITS = ("token", "whole_word", "ngram", "span", "entity")


def mask_units(
    input_ids: np.ndarray,
    rng: np.random.Generator,
    *,
    unit: str,
    word_starts: np.ndarray,
    vocab_size: int,
    mask_id: int,
    special_ids: Collection[int],
    max_predictions: int,
    masked_lm_prob: float = 0.15,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    pad_id: int = 0,
    entity_spans: list[list[tuple[int, int]]] | None = None,
    max_ngram: int = 3,
    span_p: float = 0.2,
    max_span: int = 10,
) -> dict[str, np.ndarray]:
    """Masking of whole words and groups of them, with the same budget as `mask_tokens`.

    unit: `whole_word` (BERT-wwm: words in random order, skipping one that would overflow the
    budget), `ngram` (ALBERT: n <= max_ngram words, p(n) ∝ 1/n), `span` (SpanBERT: lengths in words
    ~ Geometric(span_p) clipped at max_span; 80/10/10 decided per span), `entity` (ERNIE: the
    `entity_spans` token ranges per row are units, other words are single units). Words follow
    `word_starts` (True where a token starts a word: no `##`, or a leading `▁`).

    Adds to `mask_tokens`' outputs, per prediction slot, the span it belongs to:
    `span_start`/`span_end` (token positions, end exclusive) for the span boundary objective.
    """
    if unit == "token":
        return mask_tokens(input_ids, rng, vocab_size=vocab_size, mask_id=mask_id, special_ids=special_ids,
                           max_predictions=max_predictions, masked_lm_prob=masked_lm_prob, mask_prob=mask_prob,
                           random_prob=random_prob, pad_id=pad_id)
    if unit not in UNITS:
        raise UserError(f"data.mask_unit={unit!r} is unknown; use one of {UNITS}")
    if unit == "entity" and entity_spans is None:
        raise UserError("entity masking needs entity spans; set data.lexicon to a phrase/entity list file")
    ids, special, candidate, budget = prepare(input_ids, special_ids, vocab_size, max_predictions, masked_lm_prob,
                                              mask_prob, random_prob, pad_id)
    rows, length = ids.shape
    positions = np.full((rows, max_predictions), length, np.int64)
    span_start = np.zeros((rows, max_predictions), np.int64)
    span_end = np.zeros((rows, max_predictions), np.int64)
    u = rng.random((rows, max_predictions))
    for r in range(rows):
        words = _words(candidate[r], word_starts[r])
        if unit == "whole_word":
            spans = _pick_units(words, budget[r], rng)
        elif unit == "entity":
            spans = _pick_units(_merge_entities(words, entity_spans[r]), budget[r], rng)
        elif unit == "ngram":
            spans = _pick_ngrams(words, budget[r], rng, max_ngram)
        else:
            spans = _pick_geometric(words, budget[r], rng, span_p, max_span)
        chosen = [(p, a, b) for a, b in sorted(spans) for p in range(a, b)]
        k = len(chosen)
        if k:
            positions[r, :k], span_start[r, :k], span_end[r, :k] = np.array(chosen).T
            if unit == "span":  # one decision per span: every slot reuses its span's first uniform
                first = np.searchsorted(positions[r, :k], span_start[r, :k])
                u[r, :k] = u[r, first]
    weights = positions < length
    positions = np.where(weights, positions, 0).astype(np.int32)
    out = corrupt(ids, positions, weights, rng, vocab_size=vocab_size, mask_id=mask_id, special=special,
                  mask_prob=mask_prob, random_prob=random_prob, u=u)
    out["span_start"] = np.where(weights, span_start, 0).astype(np.int32)
    out["span_end"] = np.where(weights, span_end, 0).astype(np.int32)
    return out


def _words(candidate: np.ndarray, word_start: np.ndarray) -> list[tuple[int, int]]:
    """Token ranges [a, b) of the row's maskable words: a word starts at a word-start token or
    after a non-candidate (special) token, and takes the continuation pieces that follow."""
    starts = candidate & (word_start | ~np.concatenate([[False], candidate[:-1]]))
    idx = np.flatnonzero(starts)
    if not len(idx):
        return []
    # a word runs until the next start or the next non-candidate token, whichever comes first
    length = len(candidate)
    next_stop = np.minimum.accumulate(np.where(candidate, length, np.arange(length))[::-1])[::-1]
    ends = np.minimum(np.append(idx[1:], length), next_stop[idx])
    return list(zip(idx.tolist(), ends.tolist()))


def _pick_units(units: list[tuple[int, int]], budget: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Units in random order; take each one that still fits the budget whole."""
    picked, used = [], 0
    for i in rng.permutation(len(units)):
        a, b = units[i]
        if used + (b - a) <= budget:
            picked.append((a, b))
            used += b - a
            if used == budget:
                break
    return picked


def _merge_entities(words: list[tuple[int, int]], entities: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Words, with every word inside an entity span replaced by that one span."""
    units, covered = list(entities), np.zeros(max([b for _, b in words] + [b for _, b in entities] + [0]), bool)
    for a, b in entities:
        covered[a:b] = True
    units += [(a, b) for a, b in words if not covered[a:b].any()]
    return units


def _pick_ngrams(words: list[tuple[int, int]], budget: int, rng: np.random.Generator,
                 max_ngram: int) -> list[tuple[int, int]]:
    """ALBERT: from each start word in random order, n consecutive words with p(n) ∝ 1/n; skip an
    n-gram that overlaps one already taken or would overflow the budget."""
    p = 1.0 / np.arange(1, max_ngram + 1)
    p /= p.sum()
    taken = np.zeros(len(words), bool)
    picked, used = [], 0
    ns = rng.choice(np.arange(1, max_ngram + 1), size=len(words), p=p)
    for i, n in zip(rng.permutation(len(words)), ns):
        j = min(i + n, len(words))
        size = words[j - 1][1] - words[i][0]
        if taken[i:j].any() or used + size > budget:
            continue
        taken[i:j] = True
        picked.append((words[i][0], words[j - 1][1]))
        used += size
        if used == budget:
            break
    return picked


def _pick_geometric(words: list[tuple[int, int]], budget: int, rng: np.random.Generator, p: float,
                    max_span: int) -> list[tuple[int, int]]:
    """SpanBERT: span lengths (in words) ~ Geometric(p) clipped at max_span, start word uniform;
    a span stops early rather than overflow the budget; overlapping draws are redrawn."""
    taken = np.zeros(len(words), bool)
    picked, used = [], 0
    for _ in range(20 * budget + 20):  # enough draws to fill the budget; bounded for tiny rows
        if used >= budget or taken.all():
            break
        n = min(int(rng.geometric(p)), max_span)
        i = int(rng.integers(len(words)))
        if taken[i]:
            continue
        j = i
        while j < len(words) and j - i < n and not taken[j] and used + words[j][1] - words[i][0] <= budget:
            j += 1
        if j == i:
            continue
        taken[i:j] = True
        size = words[j - 1][1] - words[i][0]
        picked.append((words[i][0], words[j - 1][1]))
        used += size
    return picked
