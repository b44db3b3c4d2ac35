"""Segment-pair pretraining instances, made the way BERT's create_pretraining_data.py makes them.

Faithfulness matters more than elegance here: results are compared against BERT, so the quirks
of `create_instances_from_document` are kept on purpose:

- the target length is drawn once per *document* (short with probability `short_seq_prob`),
  so a short-target document yields many short rows;
- a chunk of a single sentence always gets a random B (when one can be drawn), so the NotNext
  rate is somewhat above one half on real text;
- after a random B the unused sentences of the chunk are put back for the next chunk;
- truncation trims the longer segment (B on a tie) to `max_seq_length - 3` tokens, each removed
  token coming from the front or the back with equal probability.

Where BERT has no answer we choose: a random B always comes from a *different* non-empty
document (BERT may fall back to the same one); without a random B (nsp off, swap negatives, or
fewer than two non-empty documents) a one-sentence chunk is split at a random token instead,
and skipped if it is a single token. Empty sentences and documents are dropped first.

The Python loop only decides spans (integers); rows are filled with whole-array numpy ops.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from typing import Callable, Iterator, Sequence

import numpy as np

from bertology.errors import UserError

_BLOCK = 1 << 16  # uniforms drawn per refill of the decision stream


@dataclasses.dataclass(frozen=True)
class PairInstances:
    """Rows `[CLS] A [SEP] B [SEP]` padded to max_seq_length, with each segment's source."""

    input_ids: np.ndarray  # (N, L) int32; pad_id after the last [SEP]
    segment_ids: np.ndarray  # (N, L) int32; 0 on [CLS] A [SEP], 1 on B [SEP], 0 on padding
    input_mask: np.ndarray  # (N, L) int32; 1 on real tokens
    next_sentence_label: np.ndarray  # (N,) int32; 0 = B follows A, 1 = random B (or swapped pair); 2 = random B
    # under `sentence_structure` (1 is then the swapped pair)
    doc_a: np.ndarray  # (N,) int32; index into `documents` of the first segment's text
    doc_b: np.ndarray  # (N,) int32; same for the second segment


def create_pair_instances(
    documents: Sequence[Sequence[np.ndarray]],
    *,
    max_seq_length: int,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    rng: np.random.Generator,
    nsp: bool = True,
    swap_for_negative: bool = False,
    sentence_structure: bool = False,
    pad_id: int = 0,
) -> PairInstances:
    """Every document in order, cut into segment pairs as BERT's `create_instances_from_document`.

    `nsp` makes negatives (label 1): a random B from another document, or with
    `swap_for_negative` (ALBERT's sentence order) the true pair swapped. Swaps are half the rows;
    random Bs a little more, as BERT gives every one-sentence chunk one, and none at all when
    fewer than two documents have text. With `nsp=False` every B follows A and every label is 0.
    `sentence_structure` (StructBERT's three classes): a random B (label 2) a third of the time,
    the rest half swapped (label 1: B precedes A) and half in order (label 0).
    """
    if max_seq_length < 5:
        raise UserError(f"max_seq_length={max_seq_length} leaves no room for two segments; use at least 5")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise UserError(f"short_seq_prob={short_seq_prob} is not a probability; use a value in [0, 1]")
    if (swap_for_negative or sentence_structure) and not nsp:
        raise UserError("swap_for_negative and sentence_structure make negatives, which nsp=False turns off; set nsp=True")
    max_tokens = max_seq_length - 3
    flat, bounds, ranges, doc_ids = _flatten(documents)
    swap = nsp and (swap_for_negative or sentence_structure)
    spans = _choose_spans(bounds, ranges, max_tokens, short_seq_prob, _uniforms(rng).__next__,
                          random_b=nsp and (sentence_structure or not swap_for_negative) and len(ranges) >= 2,
                          swap=swap, random_prob=1 / 3 if sentence_structure else 0.5,
                          random_label=2 if sentence_structure else 1)
    da, a0, a1, db, b0, b1, label = np.array(spans, dtype=np.int64).reshape(-1, 7).T
    la, lb = a1 - a0, b1 - b0
    trim_a, trim_b = _trim_counts(la, lb, max_tokens)
    a0 = a0 + rng.binomial(trim_a, 0.5)
    b0 = b0 + rng.binomial(trim_b, 0.5)
    la, lb = la - trim_a, lb - trim_b
    swapped = (label == 1) & swap
    a0, b0 = np.where(swapped, b0, a0), np.where(swapped, a0, b0)
    la, lb = np.where(swapped, lb, la), np.where(swapped, la, lb)
    da, db = np.where(swapped, db, da), np.where(swapped, da, db)
    input_ids, segment_ids, input_mask = _fill_rows(flat, a0, la, b0, lb, max_seq_length, cls_id, sep_id, pad_id)
    doc_ids = np.asarray(doc_ids, dtype=np.int32)
    return PairInstances(input_ids, segment_ids, input_mask, label.astype(np.int32), doc_ids[da], doc_ids[db])


def create_sentence_pair_instances(
    documents: Sequence[Sequence[np.ndarray]],
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    rng: np.random.Generator,
    pad_id: int = 0,
) -> PairInstances:
    """RoBERTa's SENTENCE-PAIR+NSP inputs (Liu et al. 2019, §4.2): each row one pair of natural
    sentences, the two taken in turn from a document (label 0), or, half the time when there are
    two documents with text, the second a random sentence of another document (label 1). A
    document's last sentence, left without a partner, gets a random one (as BERT gives every
    one-sentence chunk a random B); with one document it is dropped. Pairs longer than the row are
    trimmed as BERT's `truncate_seq_pair` trims them. The rows are short: the paper raised the
    batch size to keep the tokens per batch; here the batch stays fixed."""
    if max_seq_length < 5:
        raise UserError(f"max_seq_length={max_seq_length} leaves no room for two segments; use at least 5")
    flat, bounds, ranges, doc_ids = _flatten(documents)
    u = _uniforms(rng).__next__
    spans = []
    for d, (lo, hi) in enumerate(ranges):
        for i in range(lo, hi, 2):
            if i + 1 < hi and (len(ranges) < 2 or u() >= 0.5):
                spans.append((d, i, d, i + 1, 0))
            elif len(ranges) >= 2:
                r = _below(u(), len(ranges) - 1)
                r += r >= d
                spans.append((d, i, r, ranges[r][0] + _below(u(), ranges[r][1] - ranges[r][0]), 1))
    da, sa, db, sb, label = np.array(spans, dtype=np.int64).reshape(-1, 5).T
    b = np.asarray(bounds, np.int64)
    a0, la, b0, lb = b[sa], b[sa + 1] - b[sa], b[sb], b[sb + 1] - b[sb]
    trim_a, trim_b = _trim_counts(la, lb, max_seq_length - 3)
    a0, b0 = a0 + rng.binomial(trim_a, 0.5), b0 + rng.binomial(trim_b, 0.5)
    input_ids, segment_ids, input_mask = _fill_rows(flat, a0, la - trim_a, b0, lb - trim_b, max_seq_length, cls_id,
                                                    sep_id, pad_id)
    ids = np.asarray(doc_ids, dtype=np.int32)
    return PairInstances(input_ids, segment_ids, input_mask, label.astype(np.int32), ids[da], ids[db])


def _flatten(
    documents: Sequence[Sequence[np.ndarray]],
) -> tuple[np.ndarray, list[int], list[tuple[int, int]], list[int]]:
    """All non-empty sentences as one token array; `bounds[s]` is where sentence s starts,
    `ranges[d]` the sentences of the d-th non-empty document, `doc_ids[d]` its input index."""
    sentences: list[np.ndarray] = []
    ranges: list[tuple[int, int]] = []
    doc_ids: list[int] = []
    for k, doc in enumerate(documents):
        kept = [s for s in doc if len(s)]
        if kept:
            ranges.append((len(sentences), len(sentences) + len(kept)))
            doc_ids.append(k)
            sentences.extend(kept)
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    flat = np.concatenate(sentences).astype(np.int32) if sentences else np.zeros(0, np.int32)
    if flat.ndim != 1:
        raise UserError("a sentence is not a 1-D array of token ids; pass documents as lists of 1-D int arrays")
    return flat, bounds, ranges, doc_ids


def _uniforms(rng: np.random.Generator) -> Iterator[float]:
    """Uniform [0, 1) floats drawn in blocks: one numpy call per block, not per decision."""
    while True:
        yield from rng.random(_BLOCK).tolist()


def _below(u: float, n: int) -> int:
    """A uniform integer in [0, n) from a uniform float."""
    return min(int(u * n), n - 1)


def _choose_spans(bounds: list[int], ranges: list[tuple[int, int]], max_tokens: int, short_seq_prob: float,
                  u: Callable[[], float], *, random_b: bool, swap: bool, random_prob: float = 0.5,
                  random_label: int = 1) -> list[tuple[int, ...]]:
    """(doc_a, a_start, a_stop, doc_b, b_start, b_stop, label) per instance, in token offsets of
    the flat array, before truncation; the loop of `create_instances_from_document`. A random B
    (with `random_prob`) is labelled `random_label`; with `swap`, half the others are labelled 1
    (to be swapped)."""
    spans: list[tuple[int, ...]] = []
    for d, (lo, hi) in enumerate(ranges):
        target = 2 + _below(u(), max_tokens - 1) if u() < short_seq_prob else max_tokens
        i = lo
        while i < hi:
            end = bisect_left(bounds, bounds[i] + target, i + 1, hi)  # shortest chunk reaching target
            a_end = i + 1 + _below(u(), end - i - 1) if end - i >= 2 else i + 1
            if random_b and (end - i == 1 or u() < random_prob):
                r = _below(u(), len(ranges) - 1)
                r += r >= d
                r_lo, r_hi = ranges[r]
                start = r_lo + _below(u(), r_hi - r_lo)
                stop = bisect_left(bounds, bounds[start] + target - (bounds[a_end] - bounds[i]), start + 1, r_hi)
                spans.append((d, bounds[i], bounds[a_end], r, bounds[start], bounds[stop], random_label))
                i = a_end  # the rest of the chunk is put back
                continue
            cut = bounds[a_end]
            if end - i == 1:  # no second sentence: split this one at a random token
                n = bounds[end] - bounds[i]
                if n < 2:
                    i = end
                    continue
                cut = bounds[i] + 1 + _below(u(), n - 1)
            spans.append((d, bounds[i], cut, d, cut, bounds[end], int(swap and u() < 0.5)))
            i = end
    return spans


def _trim_counts(la: np.ndarray, lb: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens BERT's `truncate_seq_pair` removes from A and from B. It trims the longer side one
    token at a time (B on a tie); which side is longer never depends on the coin flips, so the
    counts are fixed and only front-versus-back is random (drawn by the caller as binomials)."""
    excess = np.maximum(la + lb - max_tokens, 0)
    first = np.minimum(excess, np.abs(la - lb))  # from the longer side until the two are equal
    rest = excess - first  # then alternately, B first
    a_longer = la > lb
    return np.where(a_longer, first, 0) + rest // 2, np.where(a_longer, 0, first) + rest - rest // 2


def _fill_rows(flat: np.ndarray, a0: np.ndarray, la: np.ndarray, b0: np.ndarray, lb: np.ndarray, length: int,
               cls_id: int, sep_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, segment_ids, input_mask of rows `[CLS] flat[a] [SEP] flat[b] [SEP] pad...`."""
    j = np.arange(length)
    a0, la, b0, lb = a0[:, None], la[:, None], b0[:, None], lb[:, None]
    in_a = (j >= 1) & (j <= la)
    in_b = (j >= la + 2) & (j < la + 2 + lb)
    source = np.where(in_a, a0 + j - 1, np.where(in_b, b0 + j - la - 2, 0))
    ids = np.where(in_a | in_b, flat[source], pad_id)
    ids = np.where((j == la + 1) | (j == la + lb + 2), sep_id, ids)
    ids[:, 0] = cls_id
    real = j <= la + lb + 2
    segment = (j >= la + 2) & real
    return ids.astype(np.int32), segment.astype(np.int32), real.astype(np.int32)


def create_full_sentence_instances(
    documents: Sequence[Sequence[np.ndarray]],
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    pad_id: int = 0,
    cross_documents: bool = True,
) -> dict[str, np.ndarray]:
    """RoBERTa's FULL-SENTENCES inputs: `[CLS] s1 s2 ... [SEP]`, whole sentences taken in order
    until the next one would not fit, crossing document ends with a [SEP] between documents;
    with `cross_documents=False` its DOC-SENTENCES (Liu et al. 2019, §4.2; fairseq's
    `complete_doc`): a document's end also ends the row, so rows near one are shorter (the paper
    then raised the batch size to keep the tokens per batch; here the batch stays fixed).

    A sentence longer than a whole row is cut into row-sized pieces. One segment, no pair label.
    Returns input_ids, segment_ids (all 0) and input_mask, each (N, max_seq_length) int32.
    """
    if max_seq_length < 3:
        raise UserError(f"max_seq_length={max_seq_length} leaves no room for text; use at least 3")
    room = max_seq_length - 2
    rows: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    used = 0

    def put(piece: np.ndarray) -> None:
        nonlocal current, used
        if used + len(piece) > room and current:
            rows.append(current)
            current, used = [], 0
        current.append(piece)
        used += len(piece)

    separator = np.array([sep_id], np.int32)
    for doc in documents:
        sentences = [np.asarray(s, np.int32) for s in doc if len(s)]
        if not sentences:
            continue
        if current and cross_documents:
            put(separator)
        elif current:
            rows.append(current)
            current, used = [], 0
        for s in sentences:
            for k in range(0, len(s), room):
                put(s[k : k + room])
    if current:
        rows.append(current)
    ids = np.full((len(rows), max_seq_length), pad_id, np.int32)
    mask = np.zeros_like(ids)
    for r, pieces in enumerate(rows):
        if pieces[0] is separator:  # a document separator never starts or ends a row
            pieces = pieces[1:]
        if pieces and pieces[-1] is separator:
            pieces = pieces[:-1]
        body = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        n = len(body) + 2
        ids[r, :n] = np.concatenate([[cls_id], body, [sep_id]])
        mask[r, :n] = 1
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask}
