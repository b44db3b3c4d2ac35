"""Word, n-gram, span and entity masking: alignment to words, budgets, length distributions."""

import numpy as np
import pytest

from bertology.data.masking import mask_units
from bertology.data.tokenizers import load_tokenizer
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.lexicon import LexiconMatcher

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = (PAD, CLS, SEP, MASK)
VOCAB = 1000
CONT = 500  # ids >= CONT are continuation pieces ("##x"); below start a word


def rows(n_rows=2000, length=128, seed=0, continuation=0.3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, CONT, (n_rows, length))
    cont = rng.random((n_rows, length)) < continuation
    ids[cont] = rng.integers(CONT, VOCAB, cont.sum())
    n = rng.integers(length // 2, length + 1, n_rows)
    ids[np.arange(length) >= n[:, None]] = PAD
    ids[:, 0] = CLS
    ids[np.arange(n_rows), n - 1] = SEP
    return ids.astype(np.int32), n


def run(ids, unit, seed=1, max_predictions=20, **kw):
    starts = (ids < CONT) | np.isin(ids, SPECIAL)
    return mask_units(ids, np.random.default_rng(seed), unit=unit, word_starts=starts, vocab_size=VOCAB,
                      mask_id=MASK, special_ids=SPECIAL, max_predictions=max_predictions, **kw)


def words_of(row):
    """[a, b) token ranges of the row's words (a start piece and the continuation pieces after it)."""
    out, a = [], None
    for i, t in enumerate(row):
        if t in SPECIAL:
            if a is not None:
                out.append((a, i))
            a = None
        elif t < CONT or a is None:
            if a is not None:
                out.append((a, i))
            a = i
    if a is not None:
        out.append((a, len(row)))
    return out


@pytest.mark.parametrize("unit", ["whole_word", "ngram", "span"])
def test_whole_words_only_budget_and_specials(unit):
    ids, n = rows(600)
    out = run(ids, unit)
    w = out["masked_weights"] > 0
    budget = np.minimum(20, np.maximum(1, np.rint(0.15 * n)))
    count = w.sum(1)
    assert (count <= budget).all()
    assert count.sum() >= 0.9 * budget.sum()  # budgets are (nearly) filled
    assert abs(count.sum() / (n.sum()) - 0.15) < 0.02  # the 15% rate
    for r in range(len(ids)):
        chosen = set(out["masked_positions"][r][w[r]].tolist())
        assert not any(ids[r, p] in SPECIAL for p in chosen)
        for a, b in words_of(ids[r]):
            inside = {p for p in range(a, b) if p in chosen}
            assert not inside or len(inside) == b - a, "a word is masked partly"


def test_span_lengths_follow_truncated_geometric():
    # One token per word (spans in words = in tokens), and long rows: the budget cuts short only
    # each row's last span, so the drawn lengths dominate.
    ids, _ = rows(600, length=2048, continuation=0.0)
    out = run(ids, "span", max_predictions=400)
    w = out["masked_weights"] > 0
    spans = set()
    for r in range(len(ids)):
        for s, e in zip(out["span_start"][r][w[r]], out["span_end"][r][w[r]]):
            spans.add((r, int(s), int(e)))
    lengths = np.array([e - s for _, s, e in spans])
    p = 0.2
    pmf = p * (1 - p) ** np.arange(10)
    pmf[-1] = (1 - p) ** 9  # clipped at 10: the tail mass lands on 10
    observed = np.bincount(lengths, minlength=11)[1:11] / len(lengths)
    # Spans cut short by the budget shift a little mass to shorter lengths; the shape must hold.
    np.testing.assert_allclose(observed, pmf, atol=0.03)
    assert 3.0 < lengths.mean() < 4.2  # the paper's mean of about 3.8 words


def test_ngram_lengths_follow_inverse_n():
    ids, _ = rows(600, length=2048, continuation=0.0)
    out = run(ids, "ngram", max_predictions=400)
    w = out["masked_weights"] > 0
    spans = {(r, int(s), int(e)) for r in range(len(ids))
             for s, e in zip(out["span_start"][r][w[r]], out["span_end"][r][w[r]])}
    lengths = np.array([e - s for _, s, e in spans])
    observed = np.bincount(lengths, minlength=4)[1:4] / len(lengths)
    expected = np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3)
    np.testing.assert_allclose(observed, expected, atol=0.03)


def test_span_corruption_is_decided_per_span():
    ids, _ = rows(2000, continuation=0.0)
    out = run(ids, "span")
    w = out["masked_weights"] > 0
    is_mask = out["input_ids"][np.arange(len(ids))[:, None], out["masked_positions"]] == MASK
    mixed = total = 0
    for r in range(len(ids)):
        groups = {}
        for k in np.flatnonzero(w[r]):
            groups.setdefault(int(out["span_start"][r, k]), []).append(bool(is_mask[r, k]))
        for g in groups.values():
            total += 1
            mixed += len(set(g)) > 1
    assert mixed == 0 and total > 1000
    frac = np.mean([m for r in range(len(ids)) for m in is_mask[r][w[r]]])
    assert 0.75 < frac < 0.85


def test_whole_word_masking_on_wordpiece_and_sentencepiece():
    """`##` pieces (WordPiece) and `▁` starts (sentencepiece) give the same whole-word behaviour."""
    import bertology
    import pathlib
    text = "Tokenization of unbelievably uncharacteristic antidisestablishmentarianism happens everywhere."
    for vocab in (DEFAULT_VOCAB, pathlib.Path(bertology.__file__).parent / "data/assets/unigram_uncased_albert_8k.model"):
        tok = load_tokenizer(vocab)
        row = np.array([[tok.cls_id, *tok.encode(text), tok.sep_id]] * 200, np.int32)
        starts = tok.word_starts(row)
        specials = sorted(tok.special_ids)
        out = mask_units(row, np.random.default_rng(0), unit="whole_word", word_starts=starts, vocab_size=tok.vocab_size,
                         mask_id=tok.mask_id, special_ids=specials, max_predictions=8, masked_lm_prob=0.3)
        pieces = tok.convert_ids_to_tokens(row[0].tolist())
        assert any(len(p) > 1 and (p.startswith("##") or not p.startswith("\u2581")) for p in pieces[2:-1])
        for r in range(len(row)):
            chosen = set(out["masked_positions"][r][out["masked_weights"][r] > 0].tolist())
            for i in chosen:  # the piece before a chosen continuation is chosen too
                if not starts[r, i]:
                    assert i - 1 in chosen


def test_entity_masking_masks_lexicon_entries_whole(tmp_path):
    tok = load_tokenizer(DEFAULT_VOCAB)
    lexicon = tmp_path / "entities.txt"
    lexicon.write_text("regular expression\nstandard library\n", encoding="utf-8")
    matcher = LexiconMatcher(lexicon, tok)
    text = "the standard library has a regular expression module and the standard library is large"
    row = np.array([tok.cls_id, *tok.encode(text), tok.sep_id], np.int32)
    spans = matcher.spans(row)
    assert [tok.decode(row[a:b].tolist()) for a, b in spans] == ["standard library", "regular expression", "standard library"]
    rows_ = np.stack([row] * 300)
    out = mask_units(rows_, np.random.default_rng(0), unit="entity", word_starts=tok.word_starts(rows_),
                     entity_spans=[spans] * 300, vocab_size=tok.vocab_size, mask_id=tok.mask_id,
                     special_ids=sorted(tok.special_ids), max_predictions=6, masked_lm_prob=0.3)
    hit = 0
    for r in range(300):
        chosen = set(out["masked_positions"][r][out["masked_weights"][r] > 0].tolist())
        for a, b in spans:
            part = chosen & set(range(a, b))
            assert not part or part == set(range(a, b))
            hit += bool(part)
    assert hit > 100


# Chinese whole-word masking (Cui et al. 2019): WordPiece gives each character a token, a
# segmenter finds the words.
CHINESE = ["使用语言模型来预测下一个词的概率。", "自然语言处理是人工智能的一个重要方向。",
           "我们在大规模语料上预训练模型，然后在下游任务上微调。"]


def chinese_rows(tmp_path, copies):
    from bertology.data.tokenizers.wordpiece import SPECIAL_TOKENS

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join([*SPECIAL_TOKENS, *sorted({c for s in CHINESE for c in s})]) + "\n", encoding="utf-8")
    tok = load_tokenizer(vocab)
    encoded = [[tok.cls_id, *tok.encode(s), tok.sep_id] for s in CHINESE]
    length = max(map(len, encoded))
    ids = np.array([row + [tok.pad_id] * (length - len(row)) for row in encoded] * copies, np.int32)
    return tok, ids


def marked_words(tok, ids, starts):
    """The words a row's word starts mark, as text (specials and padding left out)."""
    out = []
    for i, t in enumerate(tok.convert_ids_to_tokens(ids.tolist())):
        if t.startswith("["):
            continue
        if starts[i] or not out:
            out.append(t)
        else:
            out[-1] += t
    return out


def test_chinese_whole_word_masking_masks_the_segmenters_words_whole(tmp_path):
    import jieba

    from bertology.data import transforms
    from bertology.data.segmenter import ChineseWords

    tok, ids = chinese_rows(tmp_path, copies=100)
    assert tok.convert_ids_to_tokens(tok.encode(CHINESE[0])) == list(CHINESE[0])  # one token per character
    starts = ChineseWords(tok).word_starts(ids)
    for r, sentence in enumerate(CHINESE):
        assert marked_words(tok, ids[r], starts[r]) == jieba.lcut(sentence)
    found = {w for r in range(len(CHINESE)) for w in marked_words(tok, ids[r], starts[r])}
    assert {"语言", "模型", "预测", "概率", "人工智能", "自然语言", "大规模"} <= found

    cfg = mlm_config(word_segmenter="jieba")
    transforms.MaskedLM.validate(cfg)
    partial = {}
    for segmenter in ("jieba", None):
        cfg.data.word_segmenter = segmenter
        out = transforms.make(cfg.data, tok).corrupt({"input_ids": ids}, np.random.default_rng(0))
        partial[segmenter] = 0
        for r in range(len(ids)):
            chosen = set(out["masked_positions"][r][out["masked_weights"][r] > 0].tolist())
            at = 0
            for a, word in enumerate(marked_words(tok, ids[r], starts[r])):
                span = set(range(1 + at, 1 + at + len(word)))  # +1: [CLS]
                partial[segmenter] += 0 < len(chosen & span) < len(span)
                at += len(word)
    assert partial["jieba"] == 0  # a word is masked whole or not at all
    assert partial[None] > 50  # without the segmenter, characters are masked alone


def mlm_config(**data):
    import helpers

    c = helpers.config("bert", "tiny")
    c.data.update({"mask_unit": "whole_word", "max_seq_length": 32, "max_predictions_per_seq": 10,
                   "masked_lm_prob": 0.3, **data})
    return c


@pytest.mark.parametrize("data, message", [
    (dict(word_segmenter="ltp"), r"data.word_segmenter='ltp' is unknown; use one of jieba"),
    (dict(word_segmenter="jieba", mask_unit="token"), r"data.word_segmenter='jieba' finds words, but data.mask_unit='token'"),
])
def test_bad_segmenter_settings_are_refused(data, message):
    from bertology.data import transforms
    from bertology.errors import UserError

    c = mlm_config(**data)
    with pytest.raises(UserError, match=message):
        transforms.MaskedLM.validate(c)
