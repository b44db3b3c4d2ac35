"""Tokens appended at the top of any tokenizer's vocabulary: T5's sentinels and BART's `<mask>`.

T5 never trains its 100 `<extra_id_k>` sentinels into the sentencepiece model: Hugging Face's
T5Tokenizer (`extra_ids=100`) and seqio's vocabulary append them after the model's pieces in
reverse, so `<extra_id_0>` is the last id (vocab_size - 1) and `<extra_id_k>` is vocab_size - 1 - k
(seqio `vocabularies.py`; the noising code takes sentinels from the top down for that reason).
`AddedTokens` does the same over any of our tokenizers, and also gives a `<mask>` to a vocabulary
without one (GPT-2's byte-level BPE) for BART's text infilling.

Added tokens written in the text are that token (split out before the base tokenizer sees the
rest), so `encode(decode(ids)) == ids`. Whitespace around them goes to the neighbouring text as
it is; sentencepiece drops it, as Hugging Face's T5Tokenizer does by stripping it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bertology.errors import UserError

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer

MASK = "<mask>"


def sentinel_tokens(count: int) -> list[str]:
    """T5's `<extra_id_k>` for k < count, in vocabulary order: `<extra_id_{count-1}>` first and
    `<extra_id_0>` last, so that appended they put `<extra_id_0>` on the top id."""
    return [f"<extra_id_{k}>" for k in reversed(range(count))]


class AddedTokens:
    """`base` with `tokens` appended: token i gets id base.vocab_size + i. Every role of `base`
    is kept; `mask_id` becomes the added `<mask>` where `base` has no mask token."""

    def __init__(self, base: Tokenizer, tokens: Sequence[str]) -> None:
        if not tokens:
            raise ValueError("AddedTokens needs at least one token to add")
        known = [t for t in tokens if base.convert_ids_to_tokens([base.convert_tokens_to_ids([t])[0]])[0] == t]
        if known or len(set(tokens)) != len(tokens):
            raise UserError(f"cannot add {(known or tokens)[0]!r}: it is already in the vocabulary; "
                            "load the tokenizer without extra ids or retrain it without them")
        self.base = base
        self.added = {t: base.vocab_size + i for i, t in enumerate(tokens)}
        self._added_by_id = {i: t for t, i in self.added.items()}
        self.vocab_size = base.vocab_size + len(tokens)
        self.cls_id, self.sep_id, self.pad_id = base.cls_id, base.sep_id, base.pad_id
        self.unk_id, self.eos_id = base.unk_id, base.eos_id
        self.mask_id = base.mask_id if base.mask_id is not None else self.added.get(MASK)
        self.special_ids = frozenset(base.special_ids | set(self.added.values()))
        # Longest first, so that a token that is a prefix of another never wins.
        self._split = re.compile("(" + "|".join(map(re.escape, sorted(tokens, key=len, reverse=True))) + ")")

    def tokenize(self, text: str) -> list[str]:
        return self.convert_ids_to_tokens(self.encode(text))

    def encode(self, text: str) -> list[int]:
        """Ids of `text`: added tokens where they are written, the base tokenizer's ids between."""
        ids: list[int] = []
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(self.added[part])
            elif part:
                ids.extend(self.base.encode(part))
        return ids

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.added[t] if t in self.added else self.base.convert_tokens_to_ids([t])[0] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._added_by_id.get(int(i)) or self.base.convert_ids_to_tokens([int(i)])[0] for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """The base tokenizer's text of each run of its ids, added tokens written out between."""
        out, run = [], []
        for i in map(int, ids):
            if i in self._added_by_id:
                out += [self.base.decode(run), self._added_by_id[i]]
                run = []
            else:
                run.append(i)
        return "".join([*out, self.base.decode(run)])

    def word_starts(self, ids: np.ndarray) -> np.ndarray:
        """The base tokenizer's word starts; an added token is special, so it starts a word."""
        ids = np.asarray(ids)
        starts = np.ones(ids.shape, bool)
        inside = ids < self.base.vocab_size
        starts[inside] = self.base.word_starts(ids[inside])
        return starts
