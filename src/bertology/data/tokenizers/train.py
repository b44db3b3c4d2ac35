"""Training a tokenizer on a text corpus: SentencePiece unigram / BPE, a BERT WordPiece vocab, or
a GPT-2 / RoBERTa byte-level BPE.

There is no fast trainer for Google's WordPiece in our dependencies, so a WordPiece vocab is built
from sentencepiece's C++ BPE trainer run over the words that BERT's `BasicTokenizer` produces
(each distinct word once, with its count): a word-initial piece `▁x` becomes `x`, any other piece
`##x`. Every character of the corpus is added in both forms, so WordPiece's greedy matching can
always fall back to single characters and a word only becomes [UNK] if it holds a character that
did not fit the vocab. Everything runs on one thread with a fixed seed, so it is reproducible.

A byte-level BPE is learnt by the `tokenizers` library's BPE trainer over the 256 byte characters
with the pre-tokenizer that encoding uses, and written as GPT-2 releases it (`vocab.json`: the
bytes in GPT-2's order, then the merged tokens in merge order; `merges.txt`), so transformers'
GPT2Tokenizer / RobertaTokenizer open it too. The trainer is deterministic for a given corpus.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pathlib
import tempfile
from typing import Any

import sentencepiece
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from bertology.data.tokenizers.bytebpe import EOS, MERGES_HEADER, ROBERTA_SPECIALS, gpt2_pre_tokenizer
from bertology.data.tokenizers.wordpiece import (
    MAX_INPUT_CHARS_PER_WORD,
    SPECIAL_TOKENS,
    BasicTokenizer,
    write_vocab,
)
from bertology.errors import UserError
from bertology.files import atomic_write

KINDS = ("wordpiece", "unigram", "bpe", "bytebpe")
_SUFFIX = {"wordpiece": ".txt", "unigram": ".model", "bpe": ".model"}  # bytebpe writes a directory
# Where the special pieces go. ALBERT: <pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4, no <s> / </s>.
# RoBERTa (fairseq's dictionary order): <s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=4.
# T5 (its released spiece.model): <pad>=0, </s>=1, <unk>=2, no <s>; the sentinels are added on load.
SPECIALS = {
    "albert": dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"]),
    "roberta": dict(bos_id=0, pad_id=1, eos_id=2, unk_id=3, user_defined_symbols=["<mask>"]),
    "t5": dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1),
}
# Byte-level BPE: (specials before the bytes, specials after the merged tokens). GPT-2 ends its
# vocab with <|endoftext|>; RoBERTa (fairseq) starts with <s> <pad> </s> <unk> and ends with <mask>.
BYTE_BPE_SPECIALS = {
    "gpt2": ((), (EOS,)),
    "roberta": (ROBERTA_SPECIALS[:4], ROBERTA_SPECIALS[4:]),
}
_BYTES = 256
_MAX_SENTENCES = 5_000_000  # sentencepiece samples this many lines of a larger corpus
_SEED = 0


def train_tokenizer(
    corpus: str | os.PathLike,
    vocab_size: int,
    kind: str,
    out: str | os.PathLike,
    *,
    do_lower_case: bool | None = None,
    specials: str | None = None,
) -> pathlib.Path:
    """Train a `kind` tokenizer of exactly `vocab_size` entries on `corpus`; return its path.

    `corpus` is a text file or a directory searched recursively for `.txt` files. `out` must end
    in `.txt` for wordpiece (a BERT vocab.txt) and `.model` for unigram / bpe; for bytebpe it is
    the directory that gets `vocab.json` + `merges.txt`. `do_lower_case=None` lower-cases except
    for bytebpe, which keeps the text byte for byte and cannot lower-case. `specials` picks the
    special-token layout, the first one of each table being the default: `albert`, `roberta` or
    `t5` for unigram / bpe (SPECIALS), `gpt2` or `roberta` for bytebpe (BYTE_BPE_SPECIALS).
    """
    if kind not in KINDS:
        raise UserError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")
    out = pathlib.Path(out)
    if kind == "bytebpe":
        if do_lower_case:
            raise UserError("a byte-level BPE keeps the text byte for byte and cannot lower-case; train it cased")
        if out.is_file():
            raise UserError(f"a bytebpe tokenizer is saved as a directory (vocab.json + merges.txt), got --out {out}")
        return _train_bytebpe(corpus, vocab_size, out, _layout(kind, specials))
    if out.suffix != _SUFFIX[kind]:
        raise UserError(f"a {kind} tokenizer is saved as a {_SUFFIX[kind]} file, got --out {out}")
    do_lower_case = do_lower_case is not False
    if kind == "wordpiece":
        if specials is not None:
            raise UserError(
                "special-token layouts do not apply to wordpiece (BERT's [CLS] [SEP] [MASK]); drop --specials"
            )
        return _train_wordpiece(corpus_files(corpus), vocab_size, out, do_lower_case)
    layout = _layout(kind, specials)
    files = corpus_files(corpus)
    sentencepiece.set_random_generator_seed(_SEED)
    model = _run_sentencepiece(
        corpus,
        input=[str(f) for f in files],
        model_type=kind,
        vocab_size=vocab_size,
        # Case folding lives in the model's normaliser, so the model lower-cases by itself.
        normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
        byte_fallback=kind == "bpe",
        input_sentence_size=_MAX_SENTENCES,
        shuffle_input_sentence=True,
        **layout,
    )
    return atomic_write(out, model.serialized_model_proto())


def _layout(kind: str, specials: str | None) -> Any:
    """The special-token layout named `specials` (None: the kind's default) for `kind`."""
    layouts = BYTE_BPE_SPECIALS if kind == "bytebpe" else SPECIALS
    specials = specials or next(iter(layouts))
    if specials not in layouts:
        raise UserError(f"special-token layout {specials!r} does not apply to {kind}; use one of {', '.join(layouts)}")
    return layouts[specials]


def corpus_files(corpus: str | os.PathLike) -> list[pathlib.Path]:
    """The text files of a corpus (a file, or a directory of .txt files) holding any text."""
    path = pathlib.Path(corpus)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"corpus not found: {path}; pass a text file or a directory of .txt files")
    files = [f for f in files if _has_text(f)]
    if not files:
        raise UserError(f"corpus {path} holds no text; pass a non-empty text file or directory")
    return files


def _has_text(path: pathlib.Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return any(line.strip() for line in f)


def _train_wordpiece(
    files: list[pathlib.Path], vocab_size: int, out: pathlib.Path, do_lower_case: bool
) -> pathlib.Path:
    if vocab_size < len(SPECIAL_TOKENS) + 2:
        raise UserError(f"vocab_size {vocab_size} is too small; use at least a few hundred")
    words = _count_words(files, BasicTokenizer(do_lower_case))
    chars: collections.Counter[str] = collections.Counter()
    for word, count in words.items():
        for ch in word:
            chars[ch] += count
    # Characters most frequent first; those beyond half the vocab (a huge alphabet) are dropped.
    room = (vocab_size - len(SPECIAL_TOKENS)) // 2
    alphabet = sorted(chars, key=lambda ch: (-chars[ch], ch))[:room]
    kept = set(alphabet)
    pieces = _bpe_pieces(
        {w: c for w, c in words.items() if kept.issuperset(w)}, vocab_size + len(alphabet) + 1
    )
    tokens = [*SPECIAL_TOKENS, *alphabet, *("##" + ch for ch in alphabet), *pieces]
    tokens = list(dict.fromkeys(tokens))[:vocab_size]
    # A corpus too small for the requested size: pad like BERT, with never-produced tokens.
    tokens += [f"[unused{i}]" for i in range(vocab_size - len(tokens))]
    return write_vocab(tokens, out)


def _count_words(files: list[pathlib.Path], basic: BasicTokenizer) -> collections.Counter[str]:
    words: collections.Counter[str] = collections.Counter()
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words.update(basic.tokenize(line))
    for word in [*SPECIAL_TOKENS, *(w for w in words if len(w) > MAX_INPUT_CHARS_PER_WORD)]:
        words.pop(word, None)  # specials are added separately; over-long words are [UNK] anyway
    return words


def _bpe_pieces(words: dict[str, int], vocab_size: int) -> list[str]:
    """WordPiece-style tokens from a BPE model trained on distinct words, best first."""
    with tempfile.TemporaryDirectory() as tmp:
        tsv = pathlib.Path(tmp, "words.tsv")
        ranked = sorted(words.items(), key=lambda wc: (-wc[1], wc[0]))
        tsv.write_text("".join(f"{w}\t{c}\n" for w, c in ranked), encoding="utf-8")
        model = _run_sentencepiece(
            tsv,
            input=str(tsv),
            input_format="tsv",
            model_type="bpe",
            vocab_size=vocab_size,
            hard_vocab_limit=False,  # a small corpus yields fewer merges; the caller pads
            character_coverage=1.0,
            normalization_rule_name="identity",  # the words are already normalised BERT's way
            split_by_number=False,
            pad_id=-1,
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
        )
    pieces = []
    for i in range(model.get_piece_size()):
        piece = model.id_to_piece(i)
        if model.is_unknown(i) or piece == "\u2581" or "\u2581" in piece[1:]:
            continue
        pieces.append(piece[1:] if piece.startswith("\u2581") else "##" + piece)
    return pieces


def _train_bytebpe(
    corpus: str | os.PathLike, vocab_size: int, out: pathlib.Path, layout: tuple[tuple[str, ...], tuple[str, ...]]
) -> pathlib.Path:
    files = corpus_files(corpus)
    front, back = layout
    least = _BYTES + len(front) + len(back)
    if vocab_size < least:
        raise UserError(f"vocab_size {vocab_size} is too small for a byte-level BPE; use at least {least}")
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = gpt2_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # Reserved, so that no merge makes a second "<s>" token out of text that spells it.
        special_tokens=[*front, *back],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train([str(f) for f in files], trainer)
    # The trainer numbers the specials first, then the byte characters in code-point order, which
    # is GPT-2's order of the bytes, then every merged token as it is learnt.
    trained = bpe.get_vocab()
    if len(trained) < vocab_size:
        raise UserError(
            f"corpus {corpus} holds too little text for {vocab_size} byte-level BPE tokens (it gives "
            f"{len(trained)}); lower --vocab_size or use a larger corpus"
        )
    tokens = sorted(trained, key=trained.__getitem__)[len(front) + len(back):]
    vocab = {t: i for i, t in enumerate([*front, *tokens, *back])}
    merges = json.loads(bpe.to_str())["model"]["merges"]
    out.mkdir(parents=True, exist_ok=True)
    lines = [MERGES_HEADER, *(f"{a} {b}" for a, b in merges)]
    atomic_write(out / "merges.txt", "".join(line + "\n" for line in lines).encode("utf-8"))
    # One token per line: small, and a retrained vocab diffs readably.
    text = json.dumps(vocab, ensure_ascii=False, indent=0, separators=(",", ":"))
    atomic_write(out / "vocab.json", text.encode("utf-8"))
    return out


def _run_sentencepiece(corpus: object, **options: object) -> sentencepiece.SentencePieceProcessor:
    buffer = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            model_writer=buffer, num_threads=1, minloglevel=2, **options
        )
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[-1].rsplit("] ", 1)[-1].rstrip(".")
        raise UserError(
            f"sentencepiece could not train on {corpus}: {reason}; "
            "lower --vocab_size or use a larger corpus"
        ) from None
    return sentencepiece.SentencePieceProcessor(model_proto=buffer.getvalue())
