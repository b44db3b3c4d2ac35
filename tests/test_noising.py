"""Noising for T5, BART and MASS against the reference code's rules: exact hand-built cases,
straightforward per-span references written here, and statistics over many draws; the T5
sentencepiece layout with its appended sentinels against Hugging Face's T5Tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from bertology.data import noising
from bertology.data.embedded import BYTE_BPE_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import AddedTokens, load_tokenizer
from bertology.data.tokenizers.train import train_tokenizer
from bertology.errors import UserError


def runs(mask):
    """(value, length) of each run of equal values."""
    edges = np.flatnonzero(np.diff(mask.astype(int))) + 1
    return [(bool(part[0]), len(part)) for part in np.split(mask, edges)]


# ------------------------------------------------------------------------------------------ T5


@pytest.mark.parametrize("inputs,raw,targets", [(512, 568, 114), (128, 141, 29), (256, 284, 58), (1024, 1137, 229)])
def test_random_spans_lengths_are_t5s(inputs, raw, targets):
    assert noising.random_spans_lengths(inputs, 0.15, 3.0) == (raw, targets)
    # The largest raw length whose inputs (kept + one sentinel per span + EOS) still fit.
    def fits(n):
        noise = round(n * 0.15)
        return n - noise + round(noise / 3) + 1 <= inputs
    assert fits(raw) and not fits(raw + 1)


def test_random_spans_noise_mask_counts_and_interleaving():
    rng = np.random.default_rng(0)
    for length in [2, 3, 7, 50, 141, 568]:
        for density, mean in [(0.15, 3.0), (0.5, 1.0), (0.3, 8.0)]:
            noise = min(max(round(length * density), 1), length - 1)
            spans = max(round(noise / mean), 1)
            if spans > length - noise:  # cannot interleave (T5 fails there too)
                with pytest.raises(UserError, match="noise spans"):
                    noising.random_spans_noise_mask(length, density, mean, rng)
                continue
            mask = noising.random_spans_noise_mask(length, density, mean, rng)
            r = runs(mask)
            assert mask.sum() == noise and len(r) == 2 * spans
            assert [v for v, _ in r] == [False, True] * spans  # starts kept, ends in noise


def test_random_spans_lengths_are_uniform_compositions():
    """_random_segmentation is uniform over compositions: a segment of n items in k parts has
    length j with probability C(n-j-1, k-2) / C(n-1, k-1); the mean noise span is mu."""
    rng = np.random.default_rng(1)
    masks = [noising.random_spans_noise_mask(100, 0.15, 3.0, rng) for _ in range(4000)]  # 15 noise tokens, 5 spans
    first = np.array([[n for v, n in runs(m) if v][0] for m in masks])
    js = np.arange(1, 12)
    expected = special.comb(15 - js - 1, 3) / special.comb(14, 4)
    observed = np.bincount(first, minlength=12)[1:12]
    assert stats.chisquare(observed, expected * len(first) / expected.sum()).pvalue > 1e-3
    spans = [n for m in masks for v, n in runs(m) if v]
    assert np.mean(spans) == pytest.approx(3.0)


def test_too_many_spans_is_a_user_error():
    with pytest.raises(UserError, match="noise spans"):
        noising.random_spans_noise_mask(10, 0.8, 1.0, np.random.default_rng(0))


def test_sentinels_by_hand():
    tokens = np.arange(10, 20)
    mask = np.array([0, 0, 1, 1, 0, 1, 0, 0, 1, 1], bool)
    np.testing.assert_array_equal(noising.noise_span_to_unique_sentinel(tokens, mask, 100),
                                  [10, 11, 99, 14, 98, 16, 17, 97])
    np.testing.assert_array_equal(noising.nonnoise_span_to_unique_sentinel(tokens, mask, 100),
                                  [99, 12, 13, 98, 15, 97, 18, 19])
    np.testing.assert_array_equal(noising.noise_token_to_sentinel(tokens, mask, 100),
                                  [10, 11, 99, 99, 14, 99, 16, 17, 99, 99])
    np.testing.assert_array_equal(noising.drop_noise_tokens(tokens, mask), [10, 11, 14, 16, 17])
    np.testing.assert_array_equal(noising.drop_nonnoise_tokens(tokens, mask), [12, 13, 15, 18, 19])


def test_span_corruption_sentinels_descend_and_align():
    rng = np.random.default_rng(2)
    vocab = 1000
    for _ in range(200):
        tokens = rng.integers(0, 900, 141)
        mask = noising.random_spans_noise_mask(141, 0.15, 3.0, rng)
        inputs = noising.noise_span_to_unique_sentinel(tokens, mask, vocab)
        targets = noising.nonnoise_span_to_unique_sentinel(tokens, mask, vocab)
        assert len(inputs) + 1 == 128 and len(targets) + 1 == 29  # the helper's lengths with EOS
        sentinels = inputs[inputs >= 900]
        np.testing.assert_array_equal(sentinels, vocab - 1 - np.arange(len(sentinels)))
        np.testing.assert_array_equal(targets[targets >= 900], sentinels)
        # Each input sentinel stands for the target tokens after the same sentinel.
        spans = {}
        for part in np.split(targets, np.flatnonzero(targets >= 900))[1:]:
            spans[part[0]] = part[1:]
        rebuilt = np.concatenate([spans[t] if t >= 900 else [t] for t in inputs])
        np.testing.assert_array_equal(rebuilt, tokens)


def test_iid_bert_and_deshuffle_inputs():
    rng = np.random.default_rng(3)
    length, vocab = 200_000, 5000
    tokens = rng.integers(10, 4000, length)
    mask = noising.iid_noise_mask(length, 0.15, rng)
    assert mask.mean() == pytest.approx(0.15, abs=0.005)
    bert = noising.noise_token_to_random_token_or_sentinel(tokens, mask, vocab, rng, random_prob=0.1)
    np.testing.assert_array_equal(bert[~mask], tokens[~mask])
    sentinel = bert[mask] == vocab - 1
    assert sentinel.mean() == pytest.approx(0.9, abs=0.01)  # no "keep" share: the rest is random
    assert (bert[mask][~sentinel] >= 3).all() and (bert[mask][~sentinel] < vocab).all()
    shuffled = noising.permute_noise_tokens(tokens, mask, rng)
    np.testing.assert_array_equal(shuffled[~mask], tokens[~mask])
    assert sorted(shuffled[mask]) == sorted(tokens[mask]) and (shuffled[mask] != tokens[mask]).mean() > 0.9


def test_prefix_noise_mask_is_a_uniform_prefix():
    rng = np.random.default_rng(4)
    n = np.array([noising.random_prefix_noise_mask(9, 0.5, rng).sum() for _ in range(4000)])
    counts = np.bincount(n, minlength=10)
    assert counts[0] == counts[9] == 0 and stats.chisquare(counts[1:9]).pvalue > 1e-3
    masks = [noising.random_prefix_noise_mask(9, 0.25, rng) for _ in range(500)]
    assert all(runs(m)[0][0] for m in masks)  # a prefix
    assert {int(m.sum()) for m in masks} == {4, 5, 6, 7, 8}  # round(0.5 * 8) = 4 ... 8
    with pytest.raises(UserError, match="above 0.5"):
        noising.random_prefix_noise_mask(9, 0.6, rng)


# ---------------------------------------------------------------------------------------- BART


def test_poisson_span_probs_are_the_truncated_poisson():
    probs = noising.poisson_span_probs(3.5)
    pmf = stats.poisson.pmf(np.arange(len(probs)), 3.5)
    assert pmf[-1] < 1e-7 <= pmf[-2]  # fairseq stops after the first value below 1e-7
    np.testing.assert_allclose(probs, pmf / pmf.sum(), rtol=1e-12)
    assert (probs * np.arange(len(probs))).sum() == pytest.approx(3.5, abs=1e-5)


def test_infilling_span_lengths_fill_the_budget_with_poisson_spans():
    rng = np.random.default_rng(5)
    probs = noising.poisson_span_probs(3.0)
    drawn = []
    for budget in [*rng.integers(1, 60, 300), *[3000] * 15]:
        lengths = noising.infilling_span_lengths(int(budget), probs, rng)
        assert lengths.sum() == budget and (lengths[:-1].cumsum() < budget).all()
        if budget == 3000:  # long budgets: the trimmed last span hardly biases the rest
            drawn.extend(lengths[:-1])
    drawn = np.array(drawn)
    assert drawn.mean() == pytest.approx(3.0, abs=0.1)
    assert (drawn == 0).mean() == pytest.approx(math.exp(-3.0), abs=0.01)  # zero-length: an insertion


def reference_whole_word_mask(source, starts, ratio, rng, mask_id, vocab, probs, random_ratio):
    """fairseq's add_whole_word_mask (replace_length=1) span by span: each span walks forward to
    the end of its last word, its first token becomes <mask> (or a random id) and the rest goes;
    the draws come in fairseq's order (lengths, starts, random flags, random ids, insertions)."""
    source = np.array(source)
    starts = np.array(starts, bool)
    starts[0] = starts[-1] = False
    budget = math.ceil(starts.sum() * ratio)
    lengths = noising.infilling_span_lengths(budget, probs, rng) if probs is not None else np.ones(budget, int)
    inserts = int((lengths == 0).sum())
    lengths = lengths[lengths > 0]
    at = np.flatnonzero(starts)[rng.permutation(int(starts.sum()))[: len(lengths)]]
    rand = rng.random(len(lengths)) < random_ratio
    keep = np.ones(len(source), bool)
    for a, n in zip(at, lengths):
        end, words = a + 1, 1
        while end < len(source) - 1 and (not starts[end] or words < n):
            words += starts[end]
            end += 1
        keep[a + 1 : end] = False
    source[at] = mask_id
    source[at[rand]] = rng.integers(1, vocab, int(rand.sum()))
    return noising.insertion_noise(source[keep], inserts, rng, mask_id=mask_id, vocab_size=vocab,
                                   random_ratio=random_ratio)


@pytest.mark.parametrize("probs", [noising.poisson_span_probs(3.5), noising.poisson_span_probs(0.7), None])
def test_whole_word_mask_matches_a_per_span_reference(probs):
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(3, 80))
        source = np.concatenate([[0], rng.integers(10, 90, n), [2]])
        starts = rng.random(n + 2) < 0.6
        got = noising.whole_word_mask(source, starts, 0.3, np.random.default_rng([seed, 1]), mask_id=5,
                                      vocab_size=100, span_probs=probs, replace_length=1, random_ratio=0.1)
        want = reference_whole_word_mask(source, starts, 0.3, np.random.default_rng([seed, 1]), 5, 100, probs, 0.1)
        np.testing.assert_array_equal(got, want)
        assert got[0] == 0 and got[-1] == 2  # BOS and EOS are never masked


def test_whole_word_budget_counts_words():
    source = np.array([0, 11, 12, 13, 21, 22, 31, 41, 42, 43, 51, 61, 2])
    word_list = ([11, 12, 13], [21, 22], [31], [41, 42, 43], [51], [61])  # 6 words between BOS and EOS
    starts = np.isin(source, [0, 2] + [w[0] for w in word_list])
    for seed in range(20):
        out = noising.whole_word_mask(source, starts, 0.3, np.random.default_rng(seed), mask_id=5, vocab_size=100,
                                      replace_length=-1)
        words = [out[np.isin(source, w)] for w in word_list]
        assert all((w == 5).all() or (w != 5).all() for w in words)  # whole words
        assert sum((w == 5).all() for w in words) == math.ceil(6 * 0.3)  # the budget, ceil(0.3 * 6)


def test_insertion_noise():
    rng = np.random.default_rng(6)
    tokens = np.arange(100, 140)
    for _ in range(50):
        out = noising.insertion_noise(tokens, 7, rng, mask_id=5, vocab_size=50, random_ratio=0.3)
        new = out < 100
        assert len(out) == 47 and new.sum() == 7 and not new[0] and not new[-1]
        np.testing.assert_array_equal(out[~new], tokens)
        assert (out[new] == 5).sum() >= 7 - math.ceil(7 * 0.3)  # ceil(n * random_ratio) are random ids


def test_permute_sentences_and_rotation():
    rng = np.random.default_rng(7)
    stop = 9
    source = np.array([0, 11, 12, stop, 21, stop, 31, 32, 33, 2])  # the last sentence has no full stop
    sentences = {(11, 12, stop), (21, stop), (31, 32, 33)}
    orders = []
    for _ in range(3000):
        out = noising.permute_sentences(source, stop, rng)
        assert out[0] == 0 and out[-1] == 2 and len(out) == len(source)
        parts, at = [], 1
        while at < len(out) - 1:
            part = next(s for s in sentences if tuple(out[at : at + len(s)]) == s)
            parts.append(part)
            at += len(part)
        orders.append(tuple(sorted(sentences).index(p) for p in parts))
    counts = np.unique(orders, axis=0, return_counts=True)[1]
    assert len(counts) == 6 and stats.chisquare(counts).pvalue > 1e-3  # every order equally likely
    offsets = []
    for _ in range(2000):
        out = noising.rotate(source, rng)
        body = list(source[1:-1])
        k = next(k for k in range(len(body)) if list(out[1:-1]) == body[k:] + body[:k])
        offsets.append(k)
        assert out[0] == 0 and out[-1] == 2
    # Offsets 1 ... 9 uniform; offsets 1 and 9 both leave the body unchanged (fairseq's range).
    expected = np.array([2, 1, 1, 1, 1, 1, 1, 1]) / 9 * 2000
    assert stats.chisquare(np.bincount(offsets, minlength=8), expected).pvalue > 1e-3


def test_bart_noise_keeps_bos_eos_and_one_mask_per_span():
    rng = np.random.default_rng(8)
    table = np.ones(200, bool)
    for _ in range(300):
        n = 100
        source = np.concatenate([[0], rng.integers(10, 190, n), [2]])
        out = noising.bart_noise(source, table, rng, mask_id=5, vocab_size=200, full_stop=9,
                                 span_probs=noising.poisson_span_probs(3.5), mask_random=0.0)
        assert out[0] == 0 and out[-1] == 2
        assert (out == 5).sum() <= math.ceil(n * 0.3)  # at most one <mask> per span or insertion
        assert len(out) < len(source)


# ---------------------------------------------------------------------------------------- MASS


def test_mass_fragment_placement():
    rng = np.random.default_rng(9)
    length = 21  # m = round(10.5) = 10 (half to even), starts 1 ... 11
    starts = np.array([noising.mass_fragment(length, rng)[0] for _ in range(6000)])
    assert {noising.mass_fragment(length, rng)[1] for _ in range(5)} == {10}
    expected = np.full(11, 0.6 / 11)
    expected[0] += 0.2
    expected[-1] += 0.2
    observed = np.bincount(starts, minlength=12)[1:]
    assert observed.sum() == 6000 and stats.chisquare(observed, expected * 6000).pvalue > 1e-3


def test_mass_noise_example():
    rng = np.random.default_rng(10)
    tokens = np.arange(100, 140)
    kinds = []
    for _ in range(500):
        ex = noising.mass_noise(tokens, rng, mask_id=5, vocab_size=100)
        pos = ex["positions"]
        m = len(pos)
        assert m == 20 and (np.diff(pos) == 1).all() and 0 <= pos[0] and pos[-1] <= 38
        np.testing.assert_array_equal(ex["targets"], tokens[pos + 1])
        np.testing.assert_array_equal(ex["decoder_inputs"], tokens[pos])  # shifted right, real token first
        inside = np.zeros(40, bool)
        inside[pos + 1] = True
        np.testing.assert_array_equal(ex["inputs"][~inside], tokens[~inside])
        enc = ex["inputs"][inside]
        kinds.append([(enc == 5).mean(), (enc == tokens[inside]).mean()])
    mask, keep = np.mean(kinds, axis=0)
    assert mask == pytest.approx(0.8, abs=0.02) and keep == pytest.approx(0.1, abs=0.02)


# ----------------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def t5_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("t5")
    lines = embedded_corpus_path().read_text(encoding="utf-8").splitlines()[:400]
    (tmp / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return train_tokenizer(tmp / "corpus.txt", 600, "unigram", tmp / "spiece.model", specials="t5",
                           do_lower_case=False), tmp


TEXTS = ["Return the number of items in the container.", "The <extra_id_0> fox <extra_id_1>.",
         "a<extra_id_5>b  c <extra_id_99>", "Ünïcode ⅷ 漢字 text."]


def test_t5_sentencepiece_with_sentinels_matches_hugging_face(t5_model):
    transformers = pytest.importorskip("transformers")
    path, tmp = t5_model
    ours = load_tokenizer(path, extra_ids=100)
    # transformers 5's T5Tokenizer takes a vocabulary list, not a sentencepiece file, and builds
    # from spiece.model only in from_pretrained (4.x: the sentencepiece-backed slow tokenizer).
    assert path.name == "spiece.model"
    slow = transformers.T5Tokenizer.from_pretrained(path.parent, extra_ids=100, legacy=True)
    slow.save_pretrained(tmp / "hf")
    fast = transformers.T5TokenizerFast.from_pretrained(tmp / "hf")
    assert ours.vocab_size == len(slow) == len(fast) == 700
    assert (ours.pad_id, ours.eos_id, ours.unk_id, ours.mask_id) == (0, 1, 2, None)
    sentinels = [f"<extra_id_{k}>" for k in range(100)]
    np.testing.assert_array_equal(ours.convert_tokens_to_ids(sentinels), 699 - np.arange(100))
    assert slow.convert_tokens_to_ids(sentinels) == fast.convert_tokens_to_ids(sentinels) == list(699 - np.arange(100))
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == slow.encode(text, add_special_tokens=False) == fast.encode(text, add_special_tokens=False)
        if ours.unk_id not in ids:  # sentencepiece decodes <unk> as " ⁇ "
            assert ours.encode(ours.decode(ids)) == ids
    assert ours.decode(ours.encode(TEXTS[0])) == TEXTS[0]
    assert ours.special_ids >= set(range(600, 700)) and ours.word_starts(np.array([699, 3]))[0]


def test_added_tokens_on_byte_bpe_round_trip_bytes():
    tok = load_tokenizer(BYTE_BPE_VOCAB, add_mask=True, extra_ids=3)
    assert tok.vocab_size == 8192 + 4 and tok.mask_id == 8192
    assert tok.convert_tokens_to_ids(["<mask>", "<extra_id_2>", "<extra_id_0>"]) == [8192, 8193, 8195]
    text = "Split <mask> here,<extra_id_0>and there  <extra_id_2>."
    assert tok.decode(tok.encode(text)) == text
    assert load_tokenizer(BYTE_BPE_VOCAB).encode("Split ") == tok.encode(text)[:2]
    with pytest.raises(UserError, match="already in the vocabulary"):
        AddedTokens(tok, ["<mask>"])
