"""Tokenizers behind one interface, so the data pipeline and the models never ask which kind.

A `.txt` file is a BERT WordPiece vocab, a `.model` file a SentencePiece model, and a directory
holding `vocab.json` + `merges.txt` (or that `vocab.json` itself) a GPT-2 / RoBERTa byte-level BPE;
`load_tokenizer` picks the implementation from the path, and appends T5's sentinels or a
`<mask>` on request (`added.AddedTokens`).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from bertology.data.tokenizers.added import MASK, AddedTokens, sentinel_tokens
from bertology.data.tokenizers.bytebpe import ByteLevelBPETokenizer
from bertology.data.tokenizers.spm import SentencePieceTokenizer
from bertology.data.tokenizers.wordpiece import SPECIAL_TOKENS, WordPieceTokenizer
from bertology.errors import UserError

__all__ = [
    "Tokenizer",
    "WordPieceTokenizer",
    "SentencePieceTokenizer",
    "ByteLevelBPETokenizer",
    "AddedTokens",
    "for_data",
    "load_tokenizer",
    "tokenizer_files",
]


class Tokenizer(Protocol):
    """What the rest of bertology relies on; ids index the model's embedding table."""

    vocab_size: int
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int | None  # None where the vocab has no mask token (GPT-2): no masked-LM data
    unk_id: int
    eos_id: int  # ends each document in causal-LM data (GPT-2's <|endoftext|>)
    special_ids: frozenset[int]  # every control token, never masked nor predicted

    def tokenize(self, text: str) -> list[str]: ...

    def encode(self, text: str) -> list[int]: ...

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def decode(self, ids: list[int]) -> str: ...

    def word_starts(self, ids: np.ndarray) -> np.ndarray: ...


def load_tokenizer(
    path: str | os.PathLike, *, do_lower_case: bool | None = None, extra_ids: int = 0, add_mask: bool = False
) -> Tokenizer:
    """Open a WordPiece vocab (`.txt`), a SentencePiece model (`.model`) or a byte-level BPE.

    For a vocab, `do_lower_case=None` infers the casing from the vocab itself: a vocab with any
    upper-case token (besides the specials) is cased. SentencePiece models normalise text
    themselves and byte-level BPE never changes it, so `do_lower_case` must stay None for them.

    `add_mask` appends a `<mask>` where the vocabulary has no mask token (BART's infilling on
    GPT-2's vocab); `extra_ids` then appends T5's sentinels `<extra_id_0..extra_ids-1>`, so that
    `<extra_id_0>` is the last id, as Hugging Face's `T5Tokenizer(extra_ids=100)` numbers them.
    """
    if extra_ids < 0:
        raise UserError(f"extra_ids={extra_ids} is negative; use 0 (none) or T5's 100")
    tokenizer = _load(path, do_lower_case)
    added = ([MASK] if add_mask and tokenizer.mask_id is None else []) + sentinel_tokens(extra_ids)
    return AddedTokens(tokenizer, added) if added else tokenizer


def for_data(data: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer of a run's `data` block: `vocab` (default: the shipped WordPiece) with the
    tokens its objective adds on top, `extra_ids` (T5's sentinels) and `add_mask` (BART's `<mask>`),
    so pretraining, fine-tuning, generation and features all count the same vocabulary."""
    from bertology.data.embedded import DEFAULT_VOCAB  # embedded.py imports this package

    return load_tokenizer(data.get("vocab") or DEFAULT_VOCAB, extra_ids=data.get("extra_ids", 0) or 0,
                          add_mask=bool(data.get("add_mask", False)))


def _load(path: str | os.PathLike, do_lower_case: bool | None) -> Tokenizer:
    files = tokenizer_files(path)
    kind = files[0].suffix
    if kind in (".model", ".json") and do_lower_case is not None:
        raise UserError(
            f"do_lower_case does not apply to {path}: a sentencepiece model's normaliser decides the "
            "casing and a byte-level BPE keeps the text as it is; drop the option or retrain"
        )
    if kind == ".txt":
        if do_lower_case is None:
            do_lower_case = not _has_upper_case(files[0])
        return WordPieceTokenizer(files[0], do_lower_case=do_lower_case)
    if kind == ".model":
        return SentencePieceTokenizer(files[0])
    return ByteLevelBPETokenizer(*files)


def tokenizer_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The files that make up the tokenizer at `path`, its vocab first.

    One `.txt` or `.model` file, or a byte-level BPE's `vocab.json` and the `merges.txt` beside it
    (`path` being their directory or the `vocab.json`): a cache of tokenized text must hash all of
    them, since editing either changes the ids.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        if not (path / "vocab.json").is_file():
            raise UserError(
                f"tokenizer directory {path} holds no vocab.json; pass a byte-level BPE directory "
                "(vocab.json + merges.txt), a vocab.txt or a sentencepiece .model"
            )
        path = path / "vocab.json"
    elif not path.is_file():
        raise UserError(
            f"tokenizer file not found: {path}; train one with `python -m bertology.tokenizer "
            "--vocab_size N --kind wordpiece --out vocab.txt` or use the shipped default vocab"
        )
    if path.suffix == ".json":
        merges = path.with_name("merges.txt")
        if not merges.is_file():
            raise UserError(
                f"byte-level BPE vocab {path} has no merges.txt beside it; put the merges.txt "
                "released with it in the same directory"
            )
        return [path, merges]
    if path.suffix not in (".txt", ".model"):
        raise UserError(
            f"unknown tokenizer file type: {path}; use a WordPiece vocab (.txt), a sentencepiece "
            "model (.model) or a byte-level BPE's vocab.json + merges.txt"
        )
    return [path]


def _has_upper_case(vocab: pathlib.Path) -> bool:
    with open(vocab, encoding="utf-8") as f:
        tokens = {line.rstrip("\n") for line in f} - set(SPECIAL_TOKENS)
    return any(t != t.lower() for t in tokens)
