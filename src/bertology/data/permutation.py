"""XLNet's pretraining rows and permutation masks as pure numpy functions (zihangdai/xlnet `data_utils.py`).

Each function is a pure function of its arguments and a `np.random.Generator`, so a row is
reproducible from a seed. The rules are the reference's, named after the function they mirror:

- `split_a_and_b` (`_split_a_and_b`): after the reused part, segment A runs from where the lane
  stands to a sentence boundary; B is its continuation or, half of the time, a random stretch of the
  same lane (the NSP-style label is made but XLNet's loss never reads it).
- `span_targets` (`_sample_mask`): which tokens are predicted. n-grams of n in 1..max_gram with
  p ∝ 1/n, each placed at a word start inside a context of n·alpha/beta tokens, so about beta/alpha
  (1/K, K = 6) of the tokens are predicted; random single tokens top the count up to num_predict.
  **The reference's masking bug** (zihangdai/xlnet issues #16 and #220): its loop that finds the end of
  the n-gram tests `seg[beg]` (always a word start) instead of `seg[end]`, so a "word n-gram" is
  really n sub-word tokens starting at a word start. The maintainers kept it ("not what we intended,
  but seems to work fine"); we follow the reference's behaviour, not the intended one.
- `local_perm` (`_local_perm`): the factorisation order, drawn in blocks of perm_size (one
  permutation of 0..perm_size-1 applied inside every block, later blocks after earlier ones). Tokens
  that are neither predicted nor functional (`<sep>`, `<cls>`) get rank -1: everyone sees them and
  they see no target. Predicted tokens and functional tokens keep their rank; functional tokens are
  never targets.
- `perm_mask`: 1 = position i may NOT attend to j (the reference's and Hugging Face's convention):
  j is predicted-or-functional and ranks at or after i in the order, where a target compares its
  own rank (it cannot see itself) and any other token its rank + 1 (it sees itself).
- `row_perm_mask`: the reference runs `local_perm` separately on the reused part and the rest; the
  reused rows never see the rest, the rest sees all of the reused part.
- `target_mapping`: one-hot rows of the target positions, zero-padded to num_predict (a span or
  top-up token that landed on `<sep>`/`<cls>` is not a target, so fewer real rows are possible).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Settings:
    """The data.* keys of data.objective="xlnet"; an absent key takes the reference's base setting
    (seq 512: reuse 256, perm 256, num_predict 85, bi_data, mask_alpha 6, mask_beta 1), scaled to
    the row length: reuse and perm size half the row, num_predict = seq_len·beta // alpha."""

    seq_len: int
    reuse_len: int
    num_predict: int
    perm_size: int
    bi_data: bool
    mask_alpha: int
    mask_beta: int

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> Settings:
        length = data["max_seq_length"]
        reuse = data.get("reuse_len", length // 2)
        alpha, beta = data.get("mask_alpha", 6), data.get("mask_beta", 1)
        return cls(seq_len=length, reuse_len=reuse, num_predict=data.get("num_predict", length * beta // alpha),
                   perm_size=data.get("perm_size", reuse), bi_data=bool(data.get("bi_data", True)),
                   mask_alpha=alpha, mask_beta=beta)

    @property
    def predict_in_reuse(self) -> int:
        """Targets drawn in the reused part: the larger half of num_predict (43 of 85), as the reference."""
        return self.num_predict - self.num_predict // 2


def split_a_and_b(lane: np.ndarray, sent_ids: np.ndarray, begin: int, total: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Segments A and B (|A| + |B| = `total`) starting at `lane[begin]`, and the label (1 = B
    continues A, 0 = B is random); None where the lane has too few tokens left, as the reference
    stops a lane there. `sent_ids` alternates between sentences, so a change marks a boundary."""
    n = len(lane)
    if begin + total >= n:
        return None
    end = begin + 1
    cuts: list[int] = []
    while end < n:
        if sent_ids[end] != sent_ids[end - 1]:
            if end - begin >= total:
                break
            cuts.append(end)
        end += 1
    a_end = a_begin = begin
    if not cuts or rng.random() < 0.5:
        label = 0
        a_end = end if not cuts else int(rng.choice(cuts))
        b_len = max(1, total - (a_end - a_begin))
        b_begin = int(rng.integers(0, n - 1 - b_len + 1))  # the reference's randint(0, n - 1 - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
            b_begin -= 1  # widen B to whole sentences
        while b_end < n - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
            b_end += 1
    else:
        label = 1
        a_end = int(rng.choice(cuts))
        b_begin, b_end = a_end, end
    while a_end - a_begin + b_end - b_begin > total:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    if a_end >= n or b_end >= n:  # the reference keeps one token after each segment for its shifted targets
        return None
    return lane[a_begin:a_end], lane[b_begin:b_end], label


def span_targets(word_starts: np.ndarray, rng: np.random.Generator, *, num_predict: int | None, alpha: int = 6,
                 beta: int = 1, max_gram: int = 5) -> np.ndarray:
    """Boolean [L]: the tokens to predict in a segment whose word-start flags are `word_starts`,
    chosen as the module docstring says (reference bug included: n sub-word tokens from a word
    start); exactly `num_predict` of them (≤ L), or, with None, the spans alone (the reference's
    option without a count). Each span of n tokens takes n·alpha/beta context tokens around it (plus
    the step to the next word start), so without a count beta/(alpha + beta) of the tokens are
    predicted (1/7 for K = 6); the reference's count (85 of 512, 1/6) tops that up."""
    length = len(word_starts)
    chosen = np.zeros(length, bool)
    weights = 1.0 / np.arange(1, max_gram + 1)
    cumulative = np.cumsum(weights / weights.sum())[:-1].tolist()  # n = 1 + how many of these u passes
    count = cursor = 0
    while cursor < length and (num_predict is None or count < num_predict):
        n = 1 + bisect.bisect_right(cumulative, rng.random())
        if num_predict is not None:
            n = min(n, num_predict - count)
        context = n * alpha // beta
        left = int(rng.random() * context)  # uniform on 0 ... context - 1
        begin = cursor + left
        while begin < length and not word_starts[begin]:
            begin += 1
        if begin + n >= length:  # the reference gives up when the n-gram would reach the segment's end
            break
        chosen[begin:begin + n] = True
        count += n
        cursor = begin + n + context - left
    while num_predict is not None and count < num_predict:
        i = int(rng.integers(length))
        if not chosen[i]:
            chosen[i] = True
            count += 1
    return chosen


def local_perm(is_masked: np.ndarray, functional: np.ndarray, perm_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(rank [L] int32, is_target [L] bool) of one half: each token's place in the factorisation
    order, -1 for tokens that are neither chosen nor functional; targets are the chosen
    non-functional tokens. L must be a multiple of `perm_size`."""
    length = len(is_masked)
    within = rng.permutation(perm_size)
    order = (np.arange(0, length, perm_size)[:, None] + within[None, :]).reshape(-1)
    visible = ~is_masked & ~functional
    rank = np.where(visible, -1, order).astype(np.int32)
    return rank, is_masked & ~functional


def perm_mask(rank: np.ndarray, is_target: np.ndarray) -> np.ndarray:
    """[L, L] int8, 1 where query i may NOT attend to key j (module docstring)."""
    own = rank + (~is_target).astype(rank.dtype)
    return ((own[:, None] <= rank[None, :]) & (rank[None, :] >= 0)).astype(np.int8)


def row_perm_mask(is_masked: np.ndarray, functional: np.ndarray, reuse_len: int, perm_size: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(perm_mask [L, L] int8, is_target [L] bool) of a whole row: `local_perm` on the reused part
    and on the rest, the reused rows blocked from the rest, the rest seeing all the reused part."""
    rank0, target0 = local_perm(is_masked[:reuse_len], functional[:reuse_len], perm_size, rng)
    rank1, target1 = local_perm(is_masked[reuse_len:], functional[reuse_len:], perm_size, rng)
    length = len(is_masked)
    mask = np.zeros((length, length), np.int8)
    mask[:reuse_len, :reuse_len] = perm_mask(rank0, target0)
    mask[:reuse_len, reuse_len:] = 1
    mask[reuse_len:, reuse_len:] = perm_mask(rank1, target1)
    return mask, np.concatenate([target0, target1])


def target_mapping(is_target: np.ndarray, num_predict: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mapping [P, L] float32 one-hot, positions [P] int32, weights [P] float32) for P =
    `num_predict`, targets in position order, padding rows all zero with weight 0."""
    positions = np.flatnonzero(is_target)[:num_predict]
    mapping = np.zeros((num_predict, len(is_target)), np.float32)
    mapping[np.arange(len(positions)), positions] = 1.0
    weights = np.zeros(num_predict, np.float32)
    weights[: len(positions)] = 1.0
    padded = np.zeros(num_predict, np.int32)
    padded[: len(positions)] = positions
    return mapping, padded, weights
