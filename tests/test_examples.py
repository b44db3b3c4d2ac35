"""Segment pairs as BERT makes them, checked through token ids that encode where they came from.

Every token id is BASE + doc * DOC + (its offset in the document), so a row tells which document
and which tokens each segment holds. Timing (not asserted): ~500k tokens in 5k documents take
about 0.1 s on one core.
"""

import numpy as np
import pytest

from bertology.data.examples import _trim_counts, create_pair_instances
from bertology.errors import UserError

PAD, CLS, SEP = 0, 1, 2
BASE, DOC = 100, 10_000


def corpus(n_docs=200, seed=0, sentences=(1, 40), lengths=(5, 31)):
    """Documents with random sentence counts and lengths, plus some empty documents and empty
    sentences (both must be ignored). Returns the documents and each one's sentence start offsets."""
    rng = np.random.default_rng(seed)
    docs, starts = [], []
    for d in range(n_docs):
        if d % 25 == 7:
            docs.append([])
            starts.append([])
            continue
        sizes = rng.integers(*lengths, rng.integers(*sentences))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        doc = [BASE + d * DOC + np.arange(offsets[k], offsets[k + 1], dtype=np.int32) for k in range(len(sizes))]
        if d % 10 == 3:
            doc.insert(1, np.zeros(0, np.int32))
        docs.append(doc)
        starts.append(offsets[:-1].tolist())
    return docs, starts


def make(docs, seed=0, max_seq_length=128, short_seq_prob=0.0, **kw):
    return create_pair_instances(docs, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, cls_id=CLS,
                                 sep_id=SEP, rng=np.random.default_rng(seed), **kw)


def segments(inst):
    """Per row: (doc, offsets) of the first and of the second segment."""
    out = []
    for row in inst.input_ids:
        first, second = np.flatnonzero(row == SEP)[:2]
        a, b = row[1:first] - BASE, row[first + 1 : second] - BASE
        out.append(((a[0] // DOC, a % DOC), (b[0] // DOC, b % DOC)))
    return out


def contiguous(offsets):
    return np.all(np.diff(offsets) == 1)


def follows(first, second, starts, split_ok=False):
    """`second` continues `first` in the same document: a sentence starts after first's last token
    and at or before second's first (truncation may trim either side of it). With `split_ok`, a
    lone sentence cut in two (when no random B can be drawn) also counts."""
    (da, a), (db, b) = first, second
    split = split_ok and b[0] == a[-1] + 1
    return da == db and (split or any(a[-1] < x <= b[0] for x in starts[da])) and b[0] - a[-1] <= 30


def check_rows(inst, max_seq_length):
    ids = inst.input_ids
    n, length = ids.shape
    assert length == max_seq_length
    for arr in (ids, inst.segment_ids, inst.input_mask, inst.next_sentence_label, inst.doc_a, inst.doc_b):
        assert arr.dtype == np.int32 and len(arr) == n
    assert np.all(ids[:, 0] == CLS) and np.all((ids == CLS).sum(1) == 1)
    assert np.all((ids == SEP).sum(1) == 2)
    real = inst.input_mask.sum(1)
    np.testing.assert_array_equal(inst.input_mask, np.arange(length) < real[:, None])
    assert np.all(ids[inst.input_mask == 0] == PAD)
    assert np.all(ids[np.arange(n), real - 1] == SEP)
    first_sep = np.argmax(ids == SEP, axis=1)
    assert np.all(first_sep >= 2) and np.all(real - first_sep >= 3)  # A and B non-empty
    j = np.arange(length)
    np.testing.assert_array_equal(inst.segment_ids, (j > first_sep[:, None]) & (j < real[:, None]))
    for ((da, a), (db, b)), ra, rb in zip(segments(inst), inst.doc_a, inst.doc_b):
        assert (da, db) == (ra, rb) and contiguous(a) and contiguous(b)


def test_nsp_pairs_follow_bert():
    docs, starts = corpus()
    inst = make(docs)
    check_rows(inst, 128)
    label = inst.next_sentence_label
    assert set(np.unique(label)) == {0, 1}
    forced = []
    for (first, second), y in zip(segments(inst), label):
        if y == 0:
            assert follows(first, second, starts)
        else:
            assert second[0] != first[0]
        forced.append(first[1][0] >= starts[first[0]][-1])  # A lies in its document's last sentence
    forced = np.array(forced)
    # BERT always gives a one-sentence chunk a random B; here that chunk is a document's last sentence
    assert forced.sum() > 20 and np.all(label[forced] == 1)
    free = label[~forced]
    assert abs(free.mean() - 0.5) < 4 * np.sqrt(0.25 / len(free))
    # the sentences a random B leaves unused are put back: nearly every sentence lands in some pair
    used = set()
    for (first, second), y in zip(segments(inst), label):
        for doc, offsets in [first, second] if y == 0 else [first]:
            used.update((doc, k) for k in np.searchsorted(starts[doc], offsets, side="right") - 1)
    assert len(used) > 0.98 * sum(map(len, starts))
    empty = [d for d, doc in enumerate(docs) if not doc]
    assert not np.isin(inst.doc_a, empty).any() and not np.isin(inst.doc_b, empty).any()
    assert set(inst.doc_a.tolist()) == set(range(len(docs))) - set(empty)  # every document is used


def test_short_seq_prob_makes_short_documents():
    docs, _ = corpus(n_docs=1000, sentences=(20, 40), seed=1)
    long_docs = np.array([sum(map(len, d)) >= 300 for d in docs])

    def docs_without_a_full_row(prob):
        inst = make(docs, short_seq_prob=prob)
        full = np.zeros(len(docs), bool)
        np.logical_or.at(full, inst.doc_a, inst.input_mask.sum(1) == 128)
        return np.mean(~full[long_docs]), inst

    none, _ = docs_without_a_full_row(0.0)
    assert none == 0
    # a short target t is uniform in [2, 125]; rows reach at most t + 29 + 3 tokens, so t <= 95 never fills one
    some, inst = docs_without_a_full_row(0.1)
    assert 0.04 < some < 0.12
    check_rows(inst, 128)


def test_swapped_negatives_are_the_true_pair_reversed():
    docs, starts = corpus(seed=2)
    inst = make(docs, swap_for_negative=True)
    check_rows(inst, 128)
    label = inst.next_sentence_label
    np.testing.assert_array_equal(inst.doc_a, inst.doc_b)
    for (first, second), y in zip(segments(inst), label):
        assert follows(second, first, starts, True) if y else follows(first, second, starts, True)
    assert abs(label.mean() - 0.5) < 4 * np.sqrt(0.25 / len(label))


def test_without_nsp_every_pair_is_the_true_continuation():
    docs, starts = corpus(seed=3)
    inst = make(docs, nsp=False)
    check_rows(inst, 128)
    assert np.all(inst.next_sentence_label == 0)
    assert all(follows(first, second, starts, split_ok=True) for first, second in segments(inst))


def test_one_sentence_chunks_are_split_without_a_random_b():
    sentences = [np.arange(n, dtype=np.int32) + BASE + d * DOC for d, n in enumerate([1, 2, 5, 9, 40])]
    inst = make([[s] for s in sentences], nsp=False, max_seq_length=64)
    assert inst.doc_a.tolist() == [1, 2, 3, 4]  # the one-token document cannot be split
    for row, doc in zip(inst.input_ids, inst.doc_a):
        tokens = row[(row != CLS) & (row != SEP) & (row != PAD)]
        np.testing.assert_array_equal(tokens, sentences[doc])


def test_a_single_document_gives_only_positives():
    docs, starts = corpus(n_docs=1, sentences=(60, 61))
    inst = make(docs)
    check_rows(inst, 128)
    assert len(inst.input_ids) > 5 and np.all(inst.next_sentence_label == 0)
    assert all(follows(first, second, starts, split_ok=True) for first, second in segments(inst))


def test_truncation_trims_both_ends():
    docs = [[np.arange(300, dtype=np.int32) + BASE + d * DOC] for d in range(300)]
    inst = make(docs, nsp=False, max_seq_length=32)
    check_rows(inst, 32)
    assert np.all(inst.input_mask.sum(1) == 32)
    a_start = np.array([first[1][0] for first, _ in segments(inst)])
    b_stop = np.array([second[1][-1] for _, second in segments(inst)])
    assert 0.2 < np.mean(a_start > 0) and 0.2 < np.mean(b_stop < 299)


def test_trim_counts_match_truncate_seq_pair():
    for max_tokens in range(2, 25):
        for la in range(1, 30):
            for lb in range(1, 30):
                a, b = la, lb
                while a + b > max_tokens:  # BERT's loop, without the front/back coin
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                ta, tb = _trim_counts(np.array([la]), np.array([lb]), max_tokens)
                assert (ta[0], tb[0]) == (la - a, lb - b)


def test_same_seed_same_instances_other_seed_differs():
    docs, _ = corpus(seed=4)
    a, b, c = (make(docs, seed=seed, short_seq_prob=0.1) for seed in (5, 5, 6))
    for field in ("input_ids", "segment_ids", "input_mask", "next_sentence_label", "doc_a", "doc_b"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.input_ids.shape != c.input_ids.shape or not np.array_equal(a.input_ids, c.input_ids)


def test_no_documents_give_no_rows():
    inst = make([[], []], max_seq_length=16)
    assert inst.input_ids.shape == (0, 16) and inst.next_sentence_label.shape == (0,)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_seq_length=4), "max_seq_length=4"),
        (dict(short_seq_prob=1.5), "short_seq_prob=1.5"),
        (dict(nsp=False, swap_for_negative=True), "swap_for_negative"),
    ],
)
def test_bad_input_is_a_user_error(kw, message):
    with pytest.raises(UserError, match=message):
        make(corpus(n_docs=3)[0], **kw)


def test_sentence_pairs_are_two_natural_sentences():
    """RoBERTa's SENTENCE-PAIR+NSP: segment A is one whole sentence and B the one after it (label
    0) or a random sentence of another document (label 1), about half each."""
    from bertology.data.examples import create_sentence_pair_instances

    docs, starts = corpus(n_docs=120, lengths=(5, 20))
    inst = create_sentence_pair_instances(docs, max_seq_length=64, cls_id=CLS, sep_id=SEP, rng=np.random.default_rng(0))
    assert 0.35 < inst.next_sentence_label.mean() < 0.65
    sentences = {int(s[0]): s.tolist() for doc in docs for s in doc if len(s)}  # a sentence by its first token
    for ids, seg, label, da, db in zip(inst.input_ids, inst.segment_ids, inst.next_sentence_label, inst.doc_a, inst.doc_b):
        a = [int(t) for t in ids[1:][seg[1:] == 0] if t not in (SEP, PAD)]
        b = [int(t) for t in ids[seg == 1] if t != SEP]
        assert sentences[a[0]] == a and sentences[b[0]] == b  # whole sentences (all fit in 64)
        if label == 0:
            assert da == db and (b[0] - BASE) % DOC == (a[-1] - BASE) % DOC + 1  # the very next sentence
        else:
            assert da != db
    long = create_sentence_pair_instances(docs, max_seq_length=12, cls_id=CLS, sep_id=SEP, rng=np.random.default_rng(0))
    assert (long.input_mask.sum(1) <= 12).all() and (long.input_ids[:, 0] == CLS).all()  # trimmed pairs fit
    alone = create_sentence_pair_instances(docs[:1], max_seq_length=64, cls_id=CLS, sep_id=SEP,
                                           rng=np.random.default_rng(0))
    assert len(alone.next_sentence_label) == len(docs[0]) // 2 and not alone.next_sentence_label.any()  # one document
