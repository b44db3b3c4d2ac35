"""Noising for encoder-decoder pretraining (T5, BART, MASS): pure NumPy functions on one sequence.

Each function implements one rule of a reference implementation; where the paper and the code
disagree, the code is followed and the docstring says so. `rng` is a `np.random.Generator`;
sequences are 1-D int arrays of token ids. The families' transforms (`families/t5/data.py`,
`families/bart/data.py`) turn these into batches.

- T5 (`t5.data.preprocessors`): `random_spans_noise_mask`, `iid_noise_mask`,
  `random_prefix_noise_mask`, `random_spans_lengths` (`random_spans_helper`), and the input /
  target functions `noise_span_to_unique_sentinel`, `nonnoise_span_to_unique_sentinel`,
  `noise_token_to_sentinel`, `noise_token_to_random_token_or_sentinel`, `drop_noise_tokens`,
  `drop_nonnoise_tokens`, `permute_noise_tokens`.
- BART (fairseq `fairseq/data/denoising_dataset.py`): `poisson_span_probs`, `permute_sentences`,
  `whole_word_mask`, `insertion_noise`, `rotate`, applied in that order by `bart_noise`.
- MASS (`MASS-unsupNMT/src/trainer.py: restricted_mask_sent`): `mass_noise`.
"""

from __future__ import annotations

import math

import numpy as np

from bertology.errors import UserError

# ---------------------------------------------------------------------------------------------
# T5


def _round(x: float) -> int:
    """T5 rounds with `tf.round` / Python's `round`: halves go to the even neighbour."""
    return int(np.round(x))


def random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """T5's `_random_segmentation`: `num_items` split into `num_segments` runs of >= 1 item,
    uniformly over all such splits: (num_items - 1) flags with (num_segments - 1) ones are
    shuffled, a 0 put in front, and their cumulative sum numbers each item's segment."""
    if not 1 <= num_segments <= num_items:
        raise ValueError(f"cannot split {num_items} items into {num_segments} non-empty segments")
    first_in_segment = np.concatenate([[0], rng.permutation(np.arange(num_items - 1) < num_segments - 1)])
    return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)


def random_spans_noise_mask(length: int, density: float, mean_span: float, rng: np.random.Generator) -> np.ndarray:
    """T5's `random_spans_noise_mask` (without `random_roll`): True on noise tokens.

    `round(length·density)` noise tokens, clipped to [1, length - 1], in `max(1, round(noise /
    mean_span))` spans; the noise and the non-noise tokens are each split by
    `random_segmentation` into that many spans, interleaved starting with non-noise, so the
    sequence always starts with a kept token and ends inside noise. A length below 2 is treated
    as 2 and cut back, as T5 does. More spans than kept tokens cannot interleave (T5's
    TensorFlow fails there too), so that raises a UserError naming the settings.
    """
    padded = max(length, 2)
    num_noise = min(max(_round(padded * density), 1), padded - 1)
    num_spans = max(_round(num_noise / mean_span), 1)
    num_kept = padded - num_noise
    if num_spans > num_kept:
        raise UserError(f"noise density {density} with mean span {mean_span} needs {num_spans} noise spans in "
                        f"{padded} tokens but only {num_kept} tokens stay; lower the density or raise the span length")
    noise_lengths = random_segmentation(num_noise, num_spans, rng)
    kept_lengths = random_segmentation(num_kept, num_spans, rng)
    spans = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)
    return np.repeat(np.arange(2 * num_spans) % 2 == 1, spans)[:length]


def iid_noise_mask(length: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """T5's `iid_noise_mask`: each token is noise independently with probability `density`."""
    return rng.random(length) < density


def random_prefix_noise_mask(length: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """T5's `random_prefix_noise_mask`: the noise is a prefix of n tokens, n uniform on
    [min(L - 1, max(1, round((1 - 2·density)·(L - 1)))), L - 1] (density 0.5: 1 ... L - 1).

    In T5's `prefix_lm` the *prefix* is the noise: inputs keep it (`drop_nonnoise_tokens`) and
    targets are the rest (`drop_noise_tokens`). T5 refuses densities above 0.5; so does this.
    """
    if density > 0.5:
        raise UserError(f"prefix-LM noise density {density} is above 0.5, which T5 does not define; use at most 0.5")
    most = length - 1
    least = min(most, max(1, _round((1 - 2 * density) * most)))
    return np.arange(length) < rng.integers(least, most + 1)


def random_spans_lengths(inputs_length: int, density: float, mean_span: float) -> tuple[int, int]:
    """T5's `random_spans_helper`: the largest raw chunk whose corrupted inputs (kept tokens,
    one sentinel per span, EOS) fit in `inputs_length`, and the matching targets length (noise
    tokens, one sentinel per span, EOS). 512 -> (568, 114); 128 -> (141, 29). Density 0.5 takes
    one raw token off when the targets would be longer than the inputs, as T5 does."""

    def lengths(raw: int) -> tuple[int, int]:
        noise = _round(raw * density)
        spans = _round(noise / mean_span)
        return raw - noise + spans + 1, noise + spans + 1

    raw = inputs_length - 1
    while lengths(raw + 1)[0] <= inputs_length:
        raw += 1
    inputs, targets = lengths(raw)
    if density == 0.5 and targets > inputs:
        raw, targets = raw - 1, targets - 1
    return raw, targets


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """T5's `noise_span_to_unique_sentinel`: the k-th noise span (k = 0, 1, ...) becomes the one
    token vocab_size - 1 - k (`<extra_id_k>`, numbered down from the top of the vocabulary)."""
    noise_mask = np.asarray(noise_mask, bool)
    previous = np.concatenate([[False], noise_mask[:-1]])
    first = noise_mask & ~previous
    sentinels = vocab_size - np.cumsum(first)  # vocab_size - 1 at the first span
    out = np.where(first, sentinels, tokens)
    return out[~(noise_mask & previous)].astype(np.asarray(tokens).dtype)


def nonnoise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """T5's targets for span corruption: the kept spans become the sentinels, so a target's
    `<extra_id_k>` precedes the noise span the inputs' `<extra_id_k>` stands for."""
    return noise_span_to_unique_sentinel(tokens, ~np.asarray(noise_mask, bool), vocab_size)


def noise_token_to_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """T5's `noise_token_to_sentinel` (the "MASS-style" row): every noise token becomes the one
    sentinel vocab_size - 1; the length is kept."""
    return np.where(noise_mask, vocab_size - 1, tokens).astype(np.asarray(tokens).dtype)


def noise_token_to_random_token_or_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, vocab_size: int,
                                            rng: np.random.Generator, random_prob: float = 0.1,
                                            num_reserved: int = 3) -> np.ndarray:
    """T5's "BERT-style" inputs (`noise_token_to_random_token_or_sentinel`): a noise token becomes
    a random id in [num_reserved, vocab_size) with probability `random_prob`, else the sentinel
    vocab_size - 1. Unlike BERT there is no "keep" share (the paper's 10% unchanged is not in
    the code); T5 reserves pad, EOS and UNK (ids 0-2) from the random draw."""
    use_random = rng.random(len(tokens)) < random_prob
    random_tokens = rng.integers(num_reserved, vocab_size, len(tokens))
    out = np.where(use_random, random_tokens, vocab_size - 1)
    return np.where(noise_mask, out, tokens).astype(np.asarray(tokens).dtype)


def drop_noise_tokens(tokens: np.ndarray, noise_mask: np.ndarray) -> np.ndarray:
    """T5's `drop_noise_tokens`: the kept tokens only."""
    return np.asarray(tokens)[~np.asarray(noise_mask, bool)]


def drop_nonnoise_tokens(tokens: np.ndarray, noise_mask: np.ndarray) -> np.ndarray:
    """T5's `drop_nonnoise_tokens`: the noise tokens only."""
    return np.asarray(tokens)[np.asarray(noise_mask, bool)]


def permute_noise_tokens(tokens: np.ndarray, noise_mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """T5's `permute_noise_tokens` (deshuffling with density 1): the noise tokens shuffled among
    the noise positions, the rest in place."""
    out = np.array(tokens, copy=True)
    noise_mask = np.asarray(noise_mask, bool)
    out[noise_mask] = rng.permutation(out[noise_mask])
    return out


# ---------------------------------------------------------------------------------------------
# BART


def poisson_span_probs(lam: float) -> np.ndarray:
    """fairseq's span-length distribution for text infilling: P(k) = e^-λ λ^k / k! for k = 0, 1,
    ..., stopping after the first k whose probability is below 1e-7 (at most 128 values), used as
    a categorical (renormalised). k = 0 is kept: such a span inserts a `<mask>`."""
    probs, term = [], math.exp(-lam)
    for k in range(128):
        probs.append(term)
        term *= lam / (k + 1)
        if probs[-1] < 1e-7:
            break
    probs = np.array(probs)
    return probs / probs.sum()


def infilling_span_lengths(budget: int, span_probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """fairseq's span lengths for a budget of `budget` words: `budget` draws from `span_probs`,
    more batches of `budget` while they sum to less, then cut after the first span reaching the
    budget, that span trimmed so the lengths sum to exactly `budget`. Zeros are kept (inserts)."""
    lengths = rng.choice(len(span_probs), budget, p=span_probs)
    while lengths.sum() < budget:
        lengths = np.concatenate([lengths, rng.choice(len(span_probs), budget, p=span_probs)])
    cum = np.cumsum(lengths)
    i = int(np.argmax(cum >= budget))
    lengths[i] = budget - (cum[i - 1] if i else 0)
    return lengths[: i + 1]


def permute_sentences(source: np.ndarray, full_stop: int, rng: np.random.Generator, p: float = 1.0) -> np.ndarray:
    """fairseq's `permute_sentences` over `<s> ... </s>`: sentences end at a run of full-stop
    tokens (fairseq: GPT-2's "." when the BPE is GPT-2's; the token before `</s>` is made one, so
    the tail is a sentence) and ceil(p·n) of the n sentences are shuffled among themselves, the
    first and last tokens staying in place."""
    stops = np.asarray(source) == full_stop
    stops[-2] = True
    ends = np.flatnonzero(stops[1:] & ~stops[:-1]) + 2
    n = len(ends)
    count = math.ceil(n * 2 * p / 2.0)
    substitutions = rng.permutation(n)[:count]
    order = np.arange(n)
    order[substitutions] = substitutions[rng.permutation(count)]
    starts = np.concatenate([[1], ends[:-1]])
    return np.concatenate([source[:1], *(source[starts[i] : ends[i]] for i in order), source[ends[-1] :]])


def insertion_noise(tokens: np.ndarray, count: int, rng: np.random.Generator, *, mask_id: int, vocab_size: int,
                    random_ratio: float) -> np.ndarray:
    """fairseq's `add_insertion_noise` with n = `count` new tokens: they take n random positions
    of the result other than its first and last, ceil(n·random_ratio) of them a random id in
    [1, vocab_size) and the rest `<mask>`. (fairseq passes a ratio p and inserts ceil(len·p);
    its callers' p = count / len, so the count is passed directly.)"""
    if count == 0:
        return tokens
    total = len(tokens) + count
    where = rng.permutation(total - 2)[:count] + 1
    num_random = math.ceil(count * random_ratio)
    out = np.full(total, -1, np.int64)
    out[where[num_random:]] = mask_id
    out[where[:num_random]] = rng.integers(1, vocab_size, num_random)
    noise = np.zeros(total, bool)
    noise[where] = True
    out[~noise] = tokens
    return out.astype(np.asarray(tokens).dtype)


def whole_word_mask(source: np.ndarray, is_word_start: np.ndarray, ratio: float, rng: np.random.Generator, *,
                    mask_id: int, vocab_size: int, span_probs: np.ndarray | None = None, replace_length: int = 1,
                    random_ratio: float = 0.0) -> np.ndarray:
    """fairseq's `add_whole_word_mask` over `<s> ... </s>` (`is_word_start` False at both ends,
    so BOS and EOS are never masked).

    The budget is ceil(#word starts · ratio) *words*. With `span_probs` (text infilling) span
    lengths are drawn from it until they sum to the budget, the last one trimmed; zero-length
    spans become `<mask>` insertions (`insertion_noise`, after the masking); otherwise (token /
    word masking) every span is one word. Spans start at distinct random word starts (spans may
    still overlap). A span's first token becomes `<mask>` (or, for a share `random_ratio` of the
    spans, a random id in [1, vocab_size)) and its later tokens, up to the end of its last word,
    are deleted (`replace_length=1`: one `<mask>` per span); `replace_length=0` deletes the
    whole span (token deletion), `-1` masks every token of it.
    """
    source = np.array(source, copy=True)
    starts = np.asarray(is_word_start, bool).copy()
    starts[0] = starts[-1] = False
    budget = math.ceil(starts.sum() * ratio)
    if budget == 0:
        return source
    inserts = 0
    if span_probs is not None:
        lengths = infilling_span_lengths(budget, span_probs, rng)
        inserts = int((lengths == 0).sum())
        lengths = lengths[lengths > 0]
        if len(lengths) == 0:
            return insertion_noise(source, inserts, rng, mask_id=mask_id, vocab_size=vocab_size,
                                   random_ratio=random_ratio)
    else:
        lengths = np.ones(budget, np.int64)
    count = len(lengths)
    indices = np.flatnonzero(starts)[rng.permutation(int(starts.sum()))[:count]]
    mask_random = rng.random(count) < random_ratio
    keep = np.ones(len(source), bool)
    word_start = starts.astype(np.int64)
    word_start[-1] = 255  # fairseq: a span reaching </s> ends there

    def replace(at: np.ndarray, rand: np.ndarray) -> None:
        source[at] = mask_id
        source[at[rand]] = rng.integers(1, vocab_size, int(rand.sum()))

    if replace_length == 0:
        keep[indices] = False
    else:
        replace(indices, mask_random)
    left = lengths - 1
    while len(indices):
        left = left - word_start[indices + 1]
        going = left >= 0
        indices, mask_random, left = indices[going] + 1, mask_random[going], left[going]
        if replace_length == -1:
            replace(indices, mask_random)
        else:
            keep[indices] = False
    source = source[keep]
    return insertion_noise(source, inserts, rng, mask_id=mask_id, vocab_size=vocab_size, random_ratio=random_ratio)


def rotate(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """fairseq's `add_rolling_noise` (document rotation): the body between `<s>` and `</s>`
    starts at a uniformly drawn offset 1 ... len - 1 and wraps around (offset len - 1: unchanged)."""
    offset = rng.integers(1, max(1, len(tokens) - 1) + 1)
    return np.concatenate([tokens[:1], tokens[offset:-1], tokens[1:offset], tokens[-1:]])


def bart_noise(tokens: np.ndarray, word_start_table: np.ndarray, rng: np.random.Generator, *, mask_id: int,
               vocab_size: int, full_stop: int, mask: float = 0.3, span_probs: np.ndarray | None = None,
               replace_length: int = 1, mask_random: float = 0.1, permute: float = 1.0, rotate_prob: float = 0.0,
               insert: float = 0.0) -> np.ndarray:
    """fairseq's `DenoisingDataset.__getitem__` on `<s> ... </s>`: sentence permutation (with
    probability-share `permute`), then whole-word masking of a share `mask` of the words, then
    insertion of ceil(len·insert) tokens, then rotation with probability `rotate_prob`. Word
    starts are looked up by id in `word_start_table` (fairseq's `mask_whole_word`: True for a
    token starting a word and for specials)."""
    source = np.asarray(tokens)
    if permute > 0:
        source = permute_sentences(source, full_stop, rng, permute)
    if mask > 0:
        source = whole_word_mask(source, word_start_table[source], mask, rng, mask_id=mask_id, vocab_size=vocab_size,
                                 span_probs=span_probs, replace_length=replace_length, random_ratio=mask_random)
    if insert > 0:
        source = insertion_noise(source, math.ceil(len(source) * insert), rng, mask_id=mask_id,
                                 vocab_size=vocab_size, random_ratio=mask_random)
    if rotate_prob > 0 and rng.random() < rotate_prob:
        source = rotate(source, rng)
    return source


# ---------------------------------------------------------------------------------------------
# MASS


def mass_fragment(length: int, rng: np.random.Generator, ratio: float = 0.5) -> tuple[int, int]:
    """MASS's fragment of `<s> ... </s>` (`restricted_mask_sent` with one span): m =
    round(length·ratio) tokens starting at s, where s = 1 (right after the start token) with
    probability 0.2, s = length - m (the fragment ends on the closing token) with 0.2, and
    uniform on 1 ... length - m otherwise. MASS takes `length` from the first sentence of its
    batch, whose sentences share a length; here each row uses its own."""
    m = _round(length * ratio)
    if not 1 <= m <= length - 1:
        raise UserError(f"a MASS fragment of {m} tokens does not fit a {length}-token row after its start token; "
                        "use a fragment ratio in (0, 1) and rows of at least 3 tokens")
    p = rng.random()
    if p >= 0.8:
        return 1, m
    if p >= 0.6:
        return length - m, m
    return int(rng.integers(1, length - m + 1)), m


def mass_noise(tokens: np.ndarray, rng: np.random.Generator, *, mask_id: int, vocab_size: int, ratio: float = 0.5,
               mask_prob: float = 0.8, random_prob: float = 0.1) -> dict[str, np.ndarray]:
    """MASS's masked sequence-to-sequence example from `<s> ... </s>` (`restricted_mask_sent`).

    The fragment (`mass_fragment`) is the target; in the encoder input each fragment token
    becomes `<mask>` with probability `mask_prob`, a random id in [0, vocab_size) with
    `random_prob` and stays itself otherwise (MASS's `word_pred_probs` 0.8/0.1/0.1, drawn per
    token). The decoder input is the fragment shifted right by one *including the real token
    before it* (tokens s-1 ... s+m-2, not a `<mask>` as the paper's figure shows; MASS#19), and
    `positions` are those decoder-input tokens' original positions (MASS feeds `pos - 1`).
    """
    tokens = np.asarray(tokens)
    start, m = mass_fragment(len(tokens), rng, ratio)
    fragment = np.arange(start, start + m)
    kind = rng.choice(3, m, p=[mask_prob, 1.0 - mask_prob - random_prob, random_prob])
    encoder = tokens.copy()
    encoder[fragment] = np.select([kind == 0, kind == 2], [mask_id, rng.integers(0, vocab_size, m)], tokens[fragment])
    return {"inputs": encoder, "decoder_inputs": tokens[fragment - 1], "targets": tokens[fragment],
            "positions": fragment - 1}
