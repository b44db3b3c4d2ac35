"""Tokenizers: BERT-exact WordPiece, the SentencePiece wrapper, training, loading and the CLI."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import sentencepiece

from bertology import tokenizer as cli
from bertology.data.embedded import DEFAULT_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import (
    SentencePieceTokenizer,
    WordPieceTokenizer,
    load_tokenizer,
)
from bertology.data.tokenizers.train import train_tokenizer
from bertology.data.tokenizers.wordpiece import SPECIAL_TOKENS, BasicTokenizer
from bertology.errors import UserError

VOCAB = """[PAD] [UNK] [CLS] [SEP] [MASK]
the quick brown fox un ##aff ##affa ##able ##ble ##ly run ##ning ##s
hello world cafe café Cafe Café naive naïve resume mask οδοσ
a ##a b ##b 5 中 国 我 ##国 ##人 ひら
. , ! ? ' - ¿ « » — $ [ ]""".split()


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def uncased(vocab_file):
    return WordPieceTokenizer(vocab_file)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """A few hundred sentences of the embedded corpus, built in a private cache directory."""
    tmp = tmp_path_factory.mktemp("corpus")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_CACHE", str(tmp / "cache"))
        lines = embedded_corpus_path().read_text(encoding="utf-8").splitlines()
    path = tmp / "small.txt"
    path.write_text("\n".join(lines[:400]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sp_models(small_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("sp")
    sizes = {"unigram": 500, "bpe": 700}
    return {
        kind: (train_tokenizer(small_corpus, size, kind, out / f"{kind}.model"), size)
        for kind, size in sizes.items()
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        # Greedy longest match first, not the best segmentation: ##affa wins over ##aff.
        ("unaffable", ["un", "##affa", "##ble"]),
        ("running runs", ["run", "##ning", "run", "##s"]),
        # One piece that cannot be matched turns the whole word into [UNK].
        ("unaffablez", ["[UNK]"]),
        ("xyzzy the", ["[UNK]", "the"]),
        # Lower-casing and accent stripping (on by default when uncased).
        ("Héllo WORLD", ["hello", "world"]),
        ("CAFÉ naïve Résumé", ["cafe", "naive", "resume"]),
        # HF lower-cases character by character, so a final capital sigma becomes σ, not ς.
        ("ΟΔΟΣ", ["οδοσ"]),
        # CJK ideographs are split one per token; kana is not CJK for BERT.
        ("我中国", ["我", "中", "国"]),
        ("the中fox", ["the", "中", "fox"]),
        ("ひら", ["ひら"]),
        # ASCII symbols and unicode P* are punctuation; € (a currency symbol) is not.
        ("hello,world!", ["hello", ",", "world", "!"]),
        ("¿«hello»—world?", ["¿", "«", "hello", "»", "—", "world", "?"]),
        ("$5 €5", ["$", "5", "[UNK]"]),
        ("don't", ["[UNK]", "'", "[UNK]"]),
        # Control and format characters, U+0000 and U+FFFD vanish without splitting the word.
        ("hel\x00lo wor\x7fld", ["hello", "world"]),
        # \x0b, \x1c and \x85 count as whitespace for str.split() but BERT drops them.
        ("hel\x0blo wor\x1cld f\x85ox", ["hello", "world", "fox"]),
        ("hel\u200blo wo\ufffdrld fo\u00adx", ["hello", "world", "fox"]),
        # Every kind of whitespace separates words.
        ("a\tb\nthe\u00a0fox\r\nthe\u3000b  \u2028a", ["a", "b", "the", "fox", "the", "b", "a"]),
        # Special tokens are never split, even glued to words; lower-case look-alikes are.
        ("the [MASK] fox", ["the", "[MASK]", "fox"]),
        ("the[MASK]fox[SEP]", ["the", "[MASK]", "fox", "[SEP]"]),
        ("[mask] [Mask]", ["[", "mask", "]", "[", "mask", "]"]),
        ("", []),
        (" \t\n ", []),
    ],
)
def test_wordpiece_uncased_matches_bert(uncased, text, expected):
    assert uncased.tokenize(text) == expected


@pytest.mark.parametrize(
    "options, text, expected",
    [
        ({"do_lower_case": False}, "Café café", ["Café", "café"]),
        ({"do_lower_case": False}, "CAFE Hello", ["[UNK]", "[UNK]"]),
        ({"do_lower_case": False, "strip_accents": True}, "Café", ["Cafe"]),
        ({"do_lower_case": True, "strip_accents": False}, "CAFÉ naïve", ["café", "naïve"]),
        ({"do_lower_case": False}, "the [MASK]", ["the", "[MASK]"]),
        # Composed and decomposed accents are the same word (NFC first).
        ({"do_lower_case": False}, "Cafe\u0301", ["Café"]),
        ({"tokenize_chinese_chars": False}, "中国人", ["中", "##国", "##人"]),
    ],
)
def test_wordpiece_options(vocab_file, options, text, expected):
    assert WordPieceTokenizer(vocab_file, **options).tokenize(text) == expected


def test_word_longer_than_100_chars_is_unk(uncased):
    assert uncased.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert uncased.tokenize("a" * 101 + " b") == ["[UNK]", "b"]


def test_basic_tokenizer_keeps_specials_revealed_by_cleaning():
    # A control character inside "[MASK]" is removed before the never-split check, as in HF.
    assert BasicTokenizer(do_lower_case=False).tokenize("x [MA\x00SK] y") == ["x", "[MASK]", "y"]


def test_wordpiece_ids_round_trip(uncased):
    text = "The quick brown fox, unaffable [MASK]!"
    ids = uncased.encode(text)
    assert uncased.convert_ids_to_tokens(ids) == uncased.tokenize(text)
    assert uncased.convert_tokens_to_ids(uncased.convert_ids_to_tokens(ids)) == ids
    assert ids[:4] == [VOCAB.index(t) for t in ["the", "quick", "brown", "fox"]]
    assert uncased.decode(ids + [uncased.pad_id]) == "the quick brown fox , unaffable [MASK] !"
    assert uncased.convert_tokens_to_ids(["nope"]) == [uncased.unk_id]


def test_wordpiece_roles_and_word_starts(uncased):
    assert uncased.vocab_size == len(VOCAB)
    roles = [uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id, uncased.mask_id]
    assert roles == [0, 1, 2, 3, 4]
    assert uncased.special_ids == frozenset(range(5))
    ids = np.array([uncased.encode("unaffable [MASK] the"), uncased.encode("runs fox [SEP] a")])
    expected = [[True, False, False, True, True], [True, False, True, True, True]]
    assert uncased.word_starts(ids).tolist() == expected


def test_tokenizers_pickle(uncased, sp_models):
    sp = SentencePieceTokenizer(sp_models["unigram"][0])
    text = "The quick [MASK] fox, unaffable!"
    for tok in (uncased, sp):
        assert pickle.loads(pickle.dumps(tok)).encode(text) == tok.encode(text)


def test_wordpiece_save_round_trip(uncased, tmp_path):
    saved = uncased.save(tmp_path / "sub" / "copy.txt")
    assert saved.read_text(encoding="utf-8").split("\n")[:-1] == VOCAB


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_sentencepiece_training(sp_models, kind):
    path, size = sp_models[kind]
    tok = SentencePieceTokenizer(path)
    assert tok.vocab_size == size
    assert tok.convert_ids_to_tokens(range(5)) == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    roles = [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]
    assert roles == [0, 1, 2, 3, 4]
    assert tok.special_ids == frozenset(range(5))
    assert tok.tokenize("Return THE value") == tok.tokenize("return the value")  # case folded
    assert "[MASK]" in tok.tokenize("return the [MASK] value")
    text = "Return the value of the given attribute, or raise an error."
    ids = tok.encode(text)
    assert tok.convert_tokens_to_ids(tok.tokenize(text)) == ids
    assert tok.decode(ids) == text.lower()


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_sentencepiece_word_starts(sp_models, kind):
    tok = SentencePieceTokenizer(sp_models[kind][0])
    text = "Constructs unreasonably complicated objects"
    ids = np.array(tok.encode(text))
    starts = tok.word_starts(ids)
    assert starts.tolist() == [p.startswith("\u2581") for p in tok.tokenize(text)]
    assert starts.sum() == len(text.split()) and not starts.all()
    assert tok.word_starts(np.array([[tok.cls_id, tok.mask_id]])).tolist() == [[True, True]]


def test_bpe_byte_fallback_avoids_unk(sp_models):
    tok = SentencePieceTokenizer(sp_models["bpe"][0])
    assert tok.unk_id not in tok.encode("漢字 ⅷ")


def _spm_model(tmp_path, corpus, name, **options):
    path = tmp_path / f"{name}.model"
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(path.with_suffix("")), vocab_size=300,
        minloglevel=2, num_threads=1, **options,
    )
    return path


def test_sentencepiece_roberta_specials(tmp_path, small_corpus):
    path = _spm_model(
        tmp_path, small_corpus, "roberta", bos_id=0, pad_id=1, eos_id=2, unk_id=3,
        user_defined_symbols=["<mask>"],
    )
    tok = load_tokenizer(path)
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.convention == "roberta"


def test_sentencepiece_without_specials_is_rejected(tmp_path, small_corpus):
    path = _spm_model(tmp_path, small_corpus, "plain")
    with pytest.raises(UserError, match="neither the ALBERT specials"):
        SentencePieceTokenizer(path)


def test_load_tokenizer_dispatch_and_errors(vocab_file, sp_models, tmp_path):
    assert isinstance(load_tokenizer(vocab_file), WordPieceTokenizer)
    assert isinstance(load_tokenizer(sp_models["unigram"][0]), SentencePieceTokenizer)
    with pytest.raises(UserError, match="tokenizer file not found: .*missing.txt"):
        load_tokenizer(tmp_path / "missing.txt")
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("\n".join(t for t in VOCAB if t != "[MASK]"), encoding="utf-8")
    with pytest.raises(UserError, match=r"has no \[MASK\] line"):
        load_tokenizer(no_mask)
    odd = tmp_path / "vocab.bin"
    odd.write_text("{}")
    with pytest.raises(UserError, match="unknown tokenizer file type"):
        load_tokenizer(odd)
    with pytest.raises(UserError, match="does not apply"):
        load_tokenizer(sp_models["unigram"][0], do_lower_case=True)
    not_a_model = tmp_path / "junk.model"
    not_a_model.write_text("junk")
    with pytest.raises(UserError, match="not a sentencepiece model"):
        load_tokenizer(not_a_model)


def test_load_tokenizer_infers_casing(vocab_file, tmp_path):
    assert load_tokenizer(vocab_file).tokenize("CAFE") == ["[UNK]"]  # has "Café": cased
    lower = tmp_path / "lower.txt"
    lower.write_text("\n".join([*SPECIAL_TOKENS, "cafe"]), encoding="utf-8")
    assert load_tokenizer(lower).tokenize("CAFÉ") == ["cafe"]
    assert load_tokenizer(vocab_file, do_lower_case=True).tokenize("CAFE") == ["cafe"]


def test_train_wordpiece(small_corpus, tmp_path):
    path = train_tokenizer(small_corpus, 600, "wordpiece", tmp_path / "wp.txt")
    tokens = path.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(tokens) == 600 == len(set(tokens))
    assert tokens[:5] == list(SPECIAL_TOKENS)
    basic = BasicTokenizer()
    lines = small_corpus.read_text(encoding="utf-8").splitlines()
    chars = {ch for line in lines for word in basic.tokenize(line) for ch in word}
    assert chars <= set(tokens) and {"##" + ch for ch in chars} <= set(tokens)
    assert any(len(t) > 4 for t in tokens)
    assert any(t.startswith("##") and len(t) > 4 for t in tokens)
    tok = WordPieceTokenizer(path)
    ids = list(itertools.chain.from_iterable(tok.encode(line) for line in lines))
    assert tok.unk_id not in ids
    letters = sum(len(line.replace(" ", "")) for line in lines)
    assert len(ids) < 0.5 * letters  # real subwords, not characters
    again = train_tokenizer(small_corpus, 600, "wordpiece", tmp_path / "again.txt")
    assert again.read_bytes() == path.read_bytes()


def test_train_wordpiece_pads_a_tiny_corpus(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "a.txt").write_text("Hello world.\n\nHello there!\n", encoding="utf-8")
    (corpus / "b.txt").write_text("Über café\n", encoding="utf-8")
    path = train_tokenizer(corpus, 200, "wordpiece", tmp_path / "tiny.txt", do_lower_case=False)
    tokens = path.read_text(encoding="utf-8").split("\n")[:-1]
    learned = [t for t in tokens if not t.startswith("[unused")]
    assert len(tokens) == 200 and len(learned) < 150
    assert tokens[len(learned):] == [f"[unused{i}]" for i in range(200 - len(learned))]
    assert {"Ü", "##Ü", "é", "##é", "!", "##!"} <= set(learned)  # cased, accents kept
    tok = WordPieceTokenizer(path, do_lower_case=False)
    assert tok.unk_id not in tok.encode("Hello there café! Übe")
    assert tok.tokenize("Hex") == ["[UNK]"]  # no "x" in the corpus


@pytest.mark.parametrize(
    "corpus_text, kind, out, match",
    [
        (None, "wordpiece", "v.txt", "corpus not found"),
        ("\n \n", "wordpiece", "v.txt", "holds no text"),
        ("some text", "sentencepiece", "v.model", "unknown tokenizer kind"),
        ("some text", "unigram", "v.txt", "saved as a .model file"),
        ("some text", "wordpiece", "v.model", "saved as a .txt file"),
        ("some text", "unigram", "v.model", "could not train"),
    ],
)
def test_train_errors(tmp_path, corpus_text, kind, out, match):
    corpus = tmp_path / "corpus.txt"
    if corpus_text is not None:
        corpus.write_text(corpus_text, encoding="utf-8")
    with pytest.raises(UserError, match=match):
        train_tokenizer(corpus, 5000, kind, tmp_path / out)


def test_cli_tokenize_and_train(small_corpus, tmp_path, capsys):
    assert cli.main(["--vocab", str(DEFAULT_VOCAB), "--text", "Return the [MASK]."]) == 0
    tokens, ids = capsys.readouterr().out.splitlines()
    assert tokens.split() == ["return", "the", "[MASK]", "."]
    assert ids.split()[2] == "4"
    out = tmp_path / "cli.txt"
    args = ["--corpus", str(small_corpus), "--vocab_size", "500", "--kind", "wordpiece"]
    assert cli.main([*args, "--out", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 500


def test_cli_user_error_is_one_line(tmp_path, capsys):
    assert cli.main(["--vocab", str(tmp_path / "nope.txt"), "--text", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertology.tokenizer: error: tokenizer file not found")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--kind", "bpe"])
    assert exit_info.value.code == 2
