"""Tokenizers behind one interface, so the data pipeline and the models never ask which kind.

A `.txt` file is a BERT WordPiece vocab, a `.model` file a SentencePiece model; `load_tokenizer`
picks the implementation from the suffix.
"""

from __future__ import annotations

import os
import pathlib
from typing import Protocol

import numpy as np

from bertology.data.tokenizers.spm import SentencePieceTokenizer
from bertology.data.tokenizers.wordpiece import SPECIAL_TOKENS, WordPieceTokenizer
from bertology.errors import UserError

__all__ = ["Tokenizer", "WordPieceTokenizer", "SentencePieceTokenizer", "load_tokenizer"]


class Tokenizer(Protocol):
    """What the rest of bertology relies on; ids index the model's embedding table."""

    vocab_size: int
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    unk_id: int
    eos_id: int  # ends each document in causal-LM data (GPT-2's <|endoftext|>)
    special_ids: frozenset[int]  # every control token, never masked nor predicted

    def tokenize(self, text: str) -> list[str]: ...

    def encode(self, text: str) -> list[int]: ...

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def decode(self, ids: list[int]) -> str: ...

    def word_starts(self, ids: np.ndarray) -> np.ndarray: ...


def load_tokenizer(path: str | os.PathLike, *, do_lower_case: bool | None = None) -> Tokenizer:
    """Open a WordPiece vocab (`.txt`) or a SentencePiece model (`.model`).

    For a vocab, `do_lower_case=None` infers the casing from the vocab itself: a vocab with any
    upper-case token (besides the specials) is cased. SentencePiece models normalise text
    themselves, so `do_lower_case` must stay None for them.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise UserError(
            f"tokenizer file not found: {path}; train one with `python -m bertology.tokenizer "
            "--vocab_size N --kind wordpiece --out vocab.txt` or use the shipped default vocab"
        )
    if path.suffix == ".txt":
        if do_lower_case is None:
            do_lower_case = not _has_upper_case(path)
        return WordPieceTokenizer(path, do_lower_case=do_lower_case)
    if path.suffix == ".model":
        if do_lower_case is not None:
            raise UserError(
                f"do_lower_case does not apply to sentencepiece model {path}: its normaliser "
                "decides the casing; drop the option or retrain the model"
            )
        return SentencePieceTokenizer(path)
    raise UserError(
        f"unknown tokenizer file type: {path}; use a WordPiece vocab (.txt) "
        "or a sentencepiece model (.model)"
    )


def _has_upper_case(vocab: pathlib.Path) -> bool:
    with open(vocab, encoding="utf-8") as f:
        tokens = {line.rstrip("\n") for line in f} - set(SPECIAL_TOKENS)
    return any(t != t.lower() for t in tokens)
