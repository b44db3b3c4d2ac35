"""SentencePiece (unigram or BPE) models behind the common `Tokenizer` interface.

ALBERT-style models (`<pad>`, `<unk>`, `[CLS]`, `[SEP]`, `[MASK]`, as `train_tokenizer` writes
them), RoBERTa/XLM-R-style models (`<s>`, `</s>`, `<pad>`, `<mask>`, `<unk>`) and T5-style models
(`<pad>`=0, `</s>`=1, `<unk>`=2 and nothing else: `</s>` plays [CLS] and [SEP] too, and there is no
mask token; T5's 100 `<extra_id_k>` sentinels are added on top by `load_tokenizer(extra_ids=100)`,
as Hugging Face's T5Tokenizer adds them) are accepted; which one a model uses is read from its
pieces, not assumed from ids. Any lower-casing
is part of the model's own normaliser, so the wrapper adds none.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable

import numpy as np
import sentencepiece

from bertology.errors import UserError

WORD_START = "\u2581"
# Role -> piece, for each convention: (cls, sep, pad, mask, unk); None: the convention has none.
_CONVENTIONS = {
    "albert": ("[CLS]", "[SEP]", "<pad>", "[MASK]", "<unk>"),
    "roberta": ("<s>", "</s>", "<pad>", "<mask>", "<unk>"),
    "t5": ("</s>", "</s>", "<pad>", None, "<unk>"),
}


class SentencePieceTokenizer:
    """A trained `.model` file; ids are the model's own piece ids."""

    def __init__(self, model_path: str | os.PathLike) -> None:
        path = pathlib.Path(model_path)
        if not path.is_file():
            raise UserError(f"sentencepiece model not found: {path}; pass an existing .model file")
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError):
            raise UserError(
                f"{path} is not a sentencepiece model; train one with "
                "`python -m bertology.tokenizer --kind unigram|bpe`"
            ) from None
        self.vocab_size = self._sp.get_piece_size()
        self.convention, roles = self._detect_specials(path)
        self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id = roles
        self.eos_id = self.sep_id  # `</s>` or `[SEP]`: ends a document for causal LMs
        sp = self._sp
        self.special_ids = frozenset(
            [*(r for r in roles if r is not None),
             *(i for i in range(self.vocab_size) if sp.is_control(i) or sp.is_unknown(i))]
        )
        self._word_start = np.array(
            [
                i in self.special_ids or sp.id_to_piece(i).startswith(WORD_START)
                for i in range(self.vocab_size)
            ],
            dtype=bool,
        )

    def tokenize(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str)

    def encode(self, text: str) -> list[int]:
        """Piece ids of `text`, without [CLS]/[SEP]: the data pipeline adds those."""
        return self._sp.encode(text)

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self._sp.piece_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenised text; control pieces such as <pad> decode to nothing."""
        return self._sp.decode([int(i) for i in ids])

    def word_starts(self, ids: np.ndarray) -> np.ndarray:
        """True where a piece starts a word (leading ▁) or is special; same shape as `ids`."""
        return self._word_start[np.asarray(ids)]

    def _detect_specials(self, path: pathlib.Path) -> tuple[str, tuple[int | None, ...]]:
        for convention, pieces in _CONVENTIONS.items():
            ids = tuple(None if p is None else self._sp.piece_to_id(p) for p in pieces)
            # piece_to_id answers the unknown id for a missing piece, so check the round trip.
            if all(p is None or self._sp.id_to_piece(i) == p for i, p in zip(ids, pieces)):
                return convention, ids
        albert, roberta, t5 = (" ".join(p for p in pieces if p) for pieces in _CONVENTIONS.values())
        raise UserError(
            f"sentencepiece model {path} has neither the ALBERT specials ({albert}) nor the "
            f"RoBERTa ones ({roberta}) nor T5's ({t5}); retrain it with "
            "`python -m bertology.tokenizer --kind unigram`"
        )
