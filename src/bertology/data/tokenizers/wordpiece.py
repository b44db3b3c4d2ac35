"""WordPiece tokenization that matches Hugging Face's slow `BertTokenizer` token for token.

Pretrained BERT checkpoints only make sense with the exact tokenization they were trained with,
so every step follows the reference: the special tokens are split out of the text first and never
broken up; the rest is lower-cased character by character (HF's pre-lowering, so a final capital
sigma becomes σ), cleaned (control characters, U+0000 and U+FFFD dropped, every whitespace
character turned into a space), CJK ideographs spaced out, NFC-normalised, lower-cased again,
accent-stripped (NFD, drop Mn), split on whitespace and punctuation, and finally cut into
WordPieces greedily, longest match first. A special token that only appears once a control
character is cleaned out of it ("[MA\\x00SK]") also stays whole, as in HF.

The per-character steps are `str.translate` calls over lazily filled tables, so they run at C
speed once a character has been seen, and the WordPieces of recent words are cached: the data
pipeline tokenizes whole corpora with this. Tokenizers pickle, for data-loading worker processes.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from bertology.errors import UserError
from bertology.files import atomic_write

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 100

# The CJK Unified Ideographs blocks (and extensions / compatibility blocks) from BERT's
# `_is_chinese_char`; Hangul and kana are deliberately absent, they are written with spaces.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
_SPECIALS = "|".join(re.escape(t) for t in SPECIAL_TOKENS)
_SPECIALS_RE = re.compile(f"({_SPECIALS})")
_LONE_SPECIAL_RE = re.compile(rf"(?<!\S)({_SPECIALS})(?!\S)")  # a whole whitespace-delimited word


def _is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_punctuation(ch: str) -> bool:
    """BERT counts every non-alphanumeric ASCII character as punctuation, plus unicode P*."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(cp: int) -> bool:
    """A CJK ideograph's code point (BERT's `_is_chinese_char`)."""
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


class _CharTable(dict):
    """A `str.translate` table that computes each character's replacement on first sight."""

    def __init__(self, rule: Callable[[str], str | None]) -> None:
        super().__init__()
        self._rule = rule

    def __missing__(self, cp: int) -> str | None:
        value = self[cp] = self._rule(chr(cp))
        return value


def _clean(ch: str, *, cjk: bool) -> str | None:
    if ch in "\x00\ufffd" or _is_control(ch):
        return None
    if _is_whitespace(ch):
        return " "
    return f" {ch} " if cjk and is_cjk(ord(ch)) else ch


_PUNCT_TABLE = _CharTable(lambda ch: f" {ch} " if _is_punctuation(ch) else ch)
_DROP_MN_TABLE = _CharTable(lambda ch: None if unicodedata.category(ch) == "Mn" else ch)
_CLEAN_TABLES = {
    cjk: _CharTable(functools.partial(_clean, cjk=cjk)) for cjk in (False, True)
}


class BasicTokenizer:
    """Splits text into words and punctuation the way BERT does, before WordPiece.

    `strip_accents=None` follows `do_lower_case` (BERT's uncased models strip accents, cased
    models keep them); True or False overrides that.
    """

    def __init__(
        self,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
    ) -> None:
        self.do_lower_case = do_lower_case
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars

    def tokenize(self, text: str) -> list[str]:
        """Words and punctuation marks of `text`; a special token standing alone stays whole."""
        if self.do_lower_case:
            # HF lower-cases one character at a time; only Σ lowers differently in context.
            text = text.replace("\u03a3", "\u03c3").lower()
        text = text.translate(_CLEAN_TABLES[self.tokenize_chinese_chars])
        text = unicodedata.normalize("NFC", text)
        words: list[str] = []
        for i, part in enumerate(_LONE_SPECIAL_RE.split(text)):
            words += [part] if i % 2 else self._split(part)
        return words

    def _split(self, text: str) -> list[str]:
        if self.do_lower_case:
            text = text.lower()
        if self.strip_accents:
            text = unicodedata.normalize("NFD", text).translate(_DROP_MN_TABLE)
        return text.translate(_PUNCT_TABLE).split()


class WordPieceTokenizer:
    """A BERT vocab.txt (one token per line, the id is the line number) plus BERT's tokenizer."""

    def __init__(
        self,
        vocab_path: str | os.PathLike,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
    ) -> None:
        path = pathlib.Path(vocab_path)
        try:
            with open(path, encoding="utf-8") as f:
                tokens = [line.rstrip("\n") for line in f]
        except FileNotFoundError:
            raise UserError(f"vocab file not found: {path}; pass an existing vocab.txt") from None
        except UnicodeDecodeError:
            raise UserError(f"{path} is not a UTF-8 vocab.txt; pass a BERT vocab file") from None
        self.id_to_token = tokens
        self.vocab = {token: i for i, token in enumerate(tokens)}
        for token in SPECIAL_TOKENS:
            if token not in self.vocab:
                raise UserError(
                    f"vocab {path} has no {token} line; add it (BERT needs "
                    f"{' '.join(SPECIAL_TOKENS)}) or retrain with `python -m bertology.tokenizer`"
                )
        self.vocab_size = len(tokens)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.vocab[t] for t in SPECIAL_TOKENS
        )
        self.eos_id = self.sep_id  # ends a document for causal LMs (BERT vocabs have no other end token)
        self.special_ids = frozenset(self.vocab[t] for t in SPECIAL_TOKENS)
        self.basic = BasicTokenizer(do_lower_case, strip_accents, tokenize_chinese_chars)
        self._longest = max(map(len, tokens))
        self._word_start = np.array([not t.startswith("##") for t in tokens], dtype=bool)
        self._cache_wordpieces()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_wordpieces"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache_wordpieces()

    def _cache_wordpieces(self) -> None:
        self._wordpieces = functools.lru_cache(maxsize=1 << 17)(self._wordpieces_uncached)

    def tokenize(self, text: str) -> list[str]:
        tokens: list[str] = []
        for i, chunk in enumerate(_SPECIALS_RE.split(text)):
            if i % 2:  # the splitting regex captures the special tokens at odd positions
                tokens.append(chunk)
            elif chunk:
                for word in self.basic.tokenize(chunk):
                    tokens += self._wordpieces(word)
        return tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without [CLS]/[SEP]: the data pipeline adds those."""
        return self.convert_tokens_to_ids(self.tokenize(text))

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_token[int(i)] for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Readable text: WordPieces glued back into words, [PAD] dropped, other specials kept."""
        tokens = [t for t in self.convert_ids_to_tokens(ids) if t != PAD]
        return " ".join(tokens).replace(" ##", "").strip()

    def word_starts(self, ids: np.ndarray) -> np.ndarray:
        """True where a token starts a word (no leading ##); same shape as `ids`."""
        return self._word_start[np.asarray(ids)]

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the vocab in BERT's vocab.txt format (atomically)."""
        return write_vocab(self.id_to_token, path)

    def _wordpieces_uncached(self, word: str) -> tuple[str, ...]:
        if len(word) > MAX_INPUT_CHARS_PER_WORD:
            return (UNK,)
        pieces = []
        start = 0
        while start < len(word):
            prefix = "##" if start else ""
            # No vocab entry is longer than `_longest`, so longer candidates cannot match.
            end = min(len(word), start + self._longest)
            while end > start and prefix + word[start:end] not in self.vocab:
                end -= 1
            if end == start:
                return (UNK,)
            pieces.append(prefix + word[start:end])
            start = end
        return tuple(pieces)


def write_vocab(tokens: Sequence[str], path: str | os.PathLike) -> pathlib.Path:
    """Write one token per line, BERT's vocab.txt format."""
    return atomic_write(path, "".join(t + "\n" for t in tokens).encode("utf-8"))
