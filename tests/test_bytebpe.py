"""Byte-level BPE: ids equal to transformers' GPT2Tokenizer / RobertaTokenizer (the slow ones in 4.x,
tokenizers-backed in 5), exact round trips, the trainer's GPT-2 file layout, word starts, loading
and the errors of bad files."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
from transformers import AddedToken, GPT2Tokenizer, RobertaTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode  # 4.x and 5 (5 dropped tokenization_gpt2's)

from bertology import tokenizer as cli
from bertology.data.embedded import BYTE_BPE_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import ByteLevelBPETokenizer, load_tokenizer, tokenizer_files
from bertology.data.tokenizers.train import train_tokenizer
from bertology.errors import UserError

TEXTS = [
    "Héllo wörld, naïve café — résumé! Ÿ ß ΟΔΟΣ",
    "我爱北京天安门。日本語のテキスト、한국어 텍스트",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🇫🇷 math 𝐀",
    "combining e\u0301 a\u0308 n\u0303 Z\u0351\u0352 vs precomposed é ä ñ",
    "tabs\tand\nnewlines\r\n  multiple   spaces    \n\n\tend  ",
    "don't won't I'm you're we've they'll he'd IT'S DON'T 's 'S ''",
    "numbers 3.14159 1,000,000 2024-01-01 0x1F 1e-10 ١٢٣ ½ Ⅷ x²",
    "text<|endoftext|>more text <|endoftext|> and <|endoftext|><|endoftext|>",
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext", "  leading", "trailing   ", " ", "", "\n",
    "\u00a0nbsp\u00a0 \u2003em\u3000ideographic \u2028line\u2029para \u1680 \u205f \u180e",
    "\x00\x01\x1c\x1f\x85 control \x7f\u200b\ufeff\ufffd",
    "def f(x):\n    return x ** 2  # square\n",
]
# The Unicode White_Space characters, where regex engines are most likely to disagree.
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
WHITESPACE += "\u2028\u2029\u202f\u205f\u3000"


@pytest.fixture(scope="module")
def corpus():
    """The embedded corpus, built in the session's test cache."""
    return embedded_corpus_path()


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """Small byte-level BPEs trained here, in GPT-2's and RoBERTa's layouts."""
    out = tmp_path_factory.mktemp("bytebpe")
    return {specials: train_tokenizer(corpus, 1000, "bytebpe", out / specials, specials=specials)
            for specials in ("gpt2", "roberta")}


@pytest.fixture(scope="module", params=["trained", "shipped"])
def gpt2_dir(request, trained):
    return trained["gpt2"] if request.param == "trained" else BYTE_BPE_VOCAB


def _hf(cls, directory):
    # RoBERTa's <mask> strips the whitespace before it. transformers 4 set that in
    # RobertaTokenizer itself; transformers 5's RobertaTokenizer (built on the tokenizers library)
    # leaves it to tokenizer.json, which a bare vocab.json + merges.txt lacks, so say it here.
    kwargs = {"mask_token": AddedToken("<mask>", lstrip=True, rstrip=False)} if cls is RobertaTokenizer else {}
    return cls(str(directory / "vocab.json"), str(directory / "merges.txt"), **kwargs)


def test_gpt2_ids_equal_gpt2_tokenizer(gpt2_dir, corpus):
    ours, ref = load_tokenizer(gpt2_dir), _hf(GPT2Tokenizer, gpt2_dir)
    lines = corpus.read_text(encoding="utf-8").splitlines()[::40]
    for text in TEXTS + lines:
        assert ours.tokenize(text) == ref.tokenize(text), text
        assert ours.encode(text) == ref.encode(text), text
    assert ours.eos_id == ref.eos_token_id == ref.bos_token_id == ref.unk_token_id == ours.vocab_size - 1
    assert ours.vocab_size == len(ref)


def test_gpt2_ids_equal_on_every_code_point_below_0x800(trained):
    """Each code point in the contexts GPT-2's regex treats differently: inside a word, after a
    space, doubled, before a digit and a contraction, and before a newline; plus random mixes."""
    ours, ref = load_tokenizer(trained["gpt2"]), _hf(GPT2Tokenizer, trained["gpt2"])
    chars = [chr(c) for c in range(0x800)] + list(WHITESPACE) + ["\U0001f600", "\U00020000", "\U000e0001"]
    texts = ["".join(f"a{c}b {c}{c}1 '{c}s x{c}\n" for c in chars[i:i + 64]) for i in range(0, len(chars), 64)]
    rng = random.Random(0)
    pool = "aé中😀 \t\n'sdt0.,!<|endoftext|>\u0301\u00a0\u3000\x85\r-"
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(500)]
    for text in texts:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.decode(ours.encode(text)) == text


def test_roberta_ids_equal_roberta_tokenizer(trained):
    ours, ref = load_tokenizer(trained["roberta"]), _hf(RobertaTokenizer, trained["roberta"])
    masked = ["hello <mask> world", "a\t\n <mask>x", "<mask>", "<s>x</s> <pad><unk> y<mask>"]
    for text in TEXTS + masked:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
    roles = (ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id, ours.mask_id)
    assert roles == (ref.cls_token_id, ref.sep_token_id, ref.pad_token_id, ref.unk_token_id, ref.mask_token_id)
    assert roles == (0, 2, 1, 3, 999) and ours.eos_id == 2
    assert ours.special_ids == frozenset(roles)
    # <mask> swallows the whitespace before it (HF's lstrip), the one thing decode cannot restore.
    ids = ours.encode("hello \t<mask> world")
    assert ids == ours.encode("hello<mask> world")
    assert ours.decode(ids) == "hello<mask> world"


@pytest.mark.parametrize("convention", ["roberta", "gpt2"])
def test_exported_files_load_in_transformers_with_our_ids(convention, trained, tmp_path):
    """What an HF export writes for a byte-level BPE (vocab.json, merges.txt, tokenizer_config.json)
    gives our ids through AutoTokenizer, <mask> included."""
    from transformers import AutoTokenizer

    from bertology.interop.hf import _export_tokenizer

    ours = load_tokenizer(trained[convention])
    _export_tokenizer(tokenizer_files(trained[convention]), ours, tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    for text in [*TEXTS, "hello <mask> world", "a\t\n <mask>x", "y <mask>"]:
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text


@pytest.mark.parametrize("specials", ["gpt2", "roberta"])
def test_decode_round_trips_text(trained, specials):
    tok = load_tokenizer(trained[specials])
    for text in TEXTS + ["<s>a</s><pad><unk>"]:
        assert tok.decode(tok.encode(text)) == text
        assert tok.convert_tokens_to_ids(tok.tokenize(text)) == tok.encode(text)
    assert tok.decode(np.array(tok.encode("É😀"))) == "É😀"


def test_gpt2_roles(gpt2_dir):
    tok = load_tokenizer(gpt2_dir)
    eos = tok.vocab_size - 1
    assert (tok.eos_id, tok.cls_id, tok.sep_id, tok.pad_id, tok.unk_id) == (eos,) * 5
    assert tok.mask_id is None and tok.special_ids == {eos} and tok.convention == "gpt2"
    assert tok.convert_ids_to_tokens([eos]) == ["<|endoftext|>"]


def test_shipped_asset():
    tok = load_tokenizer(BYTE_BPE_VOCAB)
    assert isinstance(tok, ByteLevelBPETokenizer) and tok.vocab_size == 8192
    text = "Return the value of the given attribute, or raise an error."
    assert len(tok.encode(text)) <= len(text.split()) + 2  # common words are single tokens


def test_trained_files_in_gpt2_layout(trained, corpus, tmp_path):
    for specials, front, back in [("gpt2", [], ["<|endoftext|>"]),
                                  ("roberta", ["<s>", "<pad>", "</s>", "<unk>"], ["<mask>"])]:
        directory = trained[specials]
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        tokens = sorted(vocab, key=vocab.__getitem__)
        assert sorted(vocab.values()) == list(range(1000))
        n = len(front)
        # GPT-2's vocab starts with the 256 byte characters in bytes_to_unicode's order.
        assert tokens[:n] == front and tokens[n:n + 256] == list(bytes_to_unicode().values())
        assert tokens[1000 - len(back):] == back
        lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
        assert lines[0] == "#version: 0.2" and lines[-1] == ""
        merges = [line.split(" ") for line in lines[1:-1]]
        assert len(merges) >= 1000 - 256 - n - len(back)
        assert all(vocab[a + b] > max(vocab[a], vocab[b]) for a, b in merges)  # built from earlier tokens
    again = train_tokenizer(corpus, 1000, "bytebpe", tmp_path / "again")
    for name in ("vocab.json", "merges.txt"):
        assert (again / name).read_bytes() == (trained["gpt2"] / name).read_bytes()


def test_word_starts_by_hand():
    tok = load_tokenizer(BYTE_BPE_VOCAB)
    text = "Return the value<|endoftext|>Héllo,  world"
    tokens = ["Return", "Ġthe", "Ġvalue", "<|endoftext|>", "H", "Ã", "©", "ll", "o", ",", "Ġ", "Ġw", "orld"]
    starts = [False, True, True, True, False, False, False, False, False, False, True, True, False]
    assert tok.tokenize(text) == tokens
    ids = np.array(tok.encode(text))
    assert tok.word_starts(ids).tolist() == starts
    assert tok.word_starts(np.stack([ids, ids])).tolist() == [starts, starts]


def test_roberta_word_starts(trained):
    tok = load_tokenizer(trained["roberta"])
    words = tok.encode("hello world")
    ids = np.array([tok.cls_id, *words, tok.mask_id, tok.sep_id, tok.pad_id])
    expected = [True, *(t.startswith("Ġ") for t in tok.convert_ids_to_tokens(words)), True, True, True]
    assert tok.word_starts(ids).tolist() == expected and expected.count(False) >= 1


def test_pickles(trained):
    tok = load_tokenizer(trained["roberta"])
    text = "The quick <mask> fox, unaffable! 😀"
    assert pickle.loads(pickle.dumps(tok)).encode(text) == tok.encode(text)


def test_load_paths_and_errors(trained, tmp_path):
    directory = trained["gpt2"]
    by_dir, by_file = load_tokenizer(directory), load_tokenizer(directory / "vocab.json")
    assert by_dir.encode(TEXTS[0]) == by_file.encode(TEXTS[0])
    assert tokenizer_files(directory) == [directory / "vocab.json", directory / "merges.txt"]
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "vocab.json").write_bytes((directory / "vocab.json").read_bytes())
    for path in (lone, lone / "vocab.json"):
        with pytest.raises(UserError, match="has no merges.txt beside it"):
            load_tokenizer(path)
    with pytest.raises(UserError, match="holds no vocab.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(UserError, match="does not apply"):
        load_tokenizer(directory, do_lower_case=False)


def _bad_files(tmp_path, vocab, merges):
    (tmp_path / "vocab.json").write_text(vocab if isinstance(vocab, str) else json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(merges, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    "vocab, merges, match",
    [
        ("{not json", "", "is not a JSON vocab"),
        (["a", "b"], "", "does not map tokens to the ids 0..N-1"),
        ({"a": 0, "b": 3, "<|endoftext|>": 1}, "", "does not map tokens to the ids 0..N-1"),
        ({"a": 0, "b": 0, "<|endoftext|>": 1}, "", "does not map tokens to the ids 0..N-1"),
        ({"a": 0, "b": "1"}, "", "does not map tokens to the ids 0..N-1"),
        ({"a": 0, "b": 1}, "", "has neither GPT-2's <|endoftext|> nor RoBERTa's"),
        ({"a": 0, "b": 1, "<|endoftext|>": 2}, "#version: 0.2\na b\n", r"does not fit .*Token `ab` out of vocabulary"),
        ({"a": 0, "b": 1, "ab": 3, "<|endoftext|>": 2}, "#version: 0.2\na  b\n", r"line 2: 'a  b' is not two tokens"),
    ],
)
def test_bad_files_are_user_errors(tmp_path, vocab, merges, match):
    with pytest.raises(UserError, match=match):
        load_tokenizer(_bad_files(tmp_path, vocab, merges))


def test_merges_without_header_keep_every_rule(tmp_path):
    tok = load_tokenizer(_bad_files(tmp_path, {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}, "a b"))
    assert tok.tokenize("abab") == ["ab", "ab"]


@pytest.mark.parametrize(
    "corpus_text, vocab_size, options, match",
    [
        ("some text", 256, {}, "too small for a byte-level BPE; use at least 257"),
        ("some text", 260, dict(specials="roberta"), "use at least 261"),
        ("some text", 5000, {}, "holds too little text for 5000"),
        ("some text", 500, dict(specials="albert"), "'albert' does not apply to bytebpe"),
        ("some text", 500, dict(do_lower_case=True), "cannot lower-case"),
    ],
)
def test_train_errors(tmp_path, corpus_text, vocab_size, options, match):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    with pytest.raises(UserError, match=match):
        train_tokenizer(corpus, vocab_size, "bytebpe", tmp_path / "out", **options)


def test_train_layout_errors_for_other_kinds(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text", encoding="utf-8")
    with pytest.raises(UserError, match="'gpt2' does not apply to unigram"):
        train_tokenizer(corpus, 500, "unigram", tmp_path / "sp.model", specials="gpt2")
    with pytest.raises(UserError, match="do not apply to wordpiece"):
        train_tokenizer(corpus, 500, "wordpiece", tmp_path / "v.txt", specials="roberta")
    with pytest.raises(UserError, match="saved as a directory"):
        train_tokenizer(corpus, 500, "bytebpe", corpus)


def test_cli_trains_and_shows_bytebpe(corpus, tmp_path, capsys):
    out = tmp_path / "cli_bpe"
    args = ["--corpus", str(corpus), "--vocab_size", "400", "--kind", "bytebpe", "--out", str(out)]
    assert cli.main([*args, "--specials", "roberta"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (bytebpe, 400 entries)")
    assert _hf(RobertaTokenizer, out).mask_token_id == 399
    assert cli.main(["--vocab", str(out), "--text", "a <mask> b"]) == 0
    tokens, ids = capsys.readouterr().out.splitlines()
    assert tokens.split() == ["a", "<mask>", "Ġb"]
    assert ids.split()[1] == "399"
