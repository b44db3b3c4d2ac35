"""Examples to model inputs: [CLS] a [SEP] (b [SEP]), padded to a fixed length, or in XLNet's layout.

The `Layout` (data.cls_position, data.padding_side) says where the summary token and the padding
go, so a family chooses its inputs by setting two data keys rather than by its name. BERT's is
[CLS] a [SEP] b [SEP] padded on the right. XLNet's (xlnet `classifier_utils.convert_single_example`,
Hugging Face's XLNetTokenizer) is a <sep> b <sep> <cls> padded on the left, so the summary token
is always the last position; its segment ids are XLNet's: a 0, b 1, <cls> 2, padding 4.

Pairs are truncated as the reference BERT code does: drop the last token of the longer side
until the pair fits. Token classification labels only the first sub-word of each word (the
others get -1 and no loss), so word-level predictions are read off first sub-words. Multiple
choice encodes (context, ending) once per ending into a [choices, length] block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from bertology.data.tokenizers import Tokenizer

IGNORE = -1  # label of positions that carry no loss


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a packed pair's summary token and padding go (module docstring)."""

    cls_position: str = "first"  # "first": [CLS] a [SEP] b [SEP] (BERT); "last": a <sep> b <sep> <cls> (XLNet)
    padding_side: str = "right"  # XLNet pads on the left

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> Layout:
        return cls(data.get("cls_position", "first"), data.get("padding_side", "right"))

    @property
    def cls_segment(self) -> int:
        return 0 if self.cls_position == "first" else 2  # XLNet's SEG_ID_CLS

    @property
    def pad_segment(self) -> int:
        return 0 if self.cls_position == "first" else 4  # XLNet's SEG_ID_PAD

    def place(self, len_a: int, len_b: int, max_len: int) -> tuple[int, int, int]:
        """(first position of a, first position of b, position of the summary token) when a pair of
        len_a and len_b tokens (len_b 0: a alone) is packed into max_len positions."""
        used = len_a + 2 + (len_b + 1 if len_b else 0)
        if used > max_len:
            raise ValueError(f"{used} tokens do not fit max_len {max_len}; truncate first")
        first = max_len - used if self.padding_side == "left" else 0
        if self.cls_position == "first":
            return first + 1, first + len_a + 2, first
        return first, first + len_a + 1, first + used - 1


BERT_LAYOUT = Layout()


def pack(tokenizer: Tokenizer, a: Sequence[int], b: Sequence[int], max_len: int,
         layout: Layout = BERT_LAYOUT) -> dict[str, np.ndarray]:
    """input_ids / input_mask / segment_ids of the pair in `layout` (default [CLS] a [SEP] (b [SEP])),
    padded to max_len."""
    a_start, b_start, cls_index = layout.place(len(a), len(b), max_len)
    ids = np.full(max_len, tokenizer.pad_id, np.int32)
    segments = np.full(max_len, layout.pad_segment, np.int32)
    mask = np.zeros(max_len, np.int32)
    first = min(a_start, cls_index)
    last = max(cls_index, (b_start + len(b)) if b else a_start + len(a))
    mask[first:last + 1] = 1
    segments[first:last + 1] = 0
    ids[a_start:a_start + len(a)] = a
    ids[a_start + len(a)] = tokenizer.sep_id
    if b:
        ids[b_start:b_start + len(b)] = b
        ids[b_start + len(b)] = tokenizer.sep_id
        segments[b_start:b_start + len(b) + 1] = 1
    ids[cls_index] = tokenizer.cls_id
    segments[cls_index] = layout.cls_segment
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def encode_pair(tokenizer: Tokenizer, text_a: str, text_b: str, max_len: int,
                layout: Layout = BERT_LAYOUT) -> dict[str, np.ndarray]:
    a, b = tokenizer.encode(text_a), tokenizer.encode(text_b) if text_b else []
    a, b = truncate_pair(a, b, max_len - (3 if b else 2))
    return pack(tokenizer, a, b, max_len, layout)


def encode_words(tokenizer: Tokenizer, words: Sequence[str], tags: Sequence[int], max_len: int,
                 layout: Layout = BERT_LAYOUT) -> dict[str, np.ndarray]:
    """Sub-words of each word; `labels` holds the word's tag at its first sub-word, -1 elsewhere.
    `word_index` maps each position back to its word (-1 for specials, padding and continuations)."""
    ids: list[int] = []
    labels: list[int] = []
    word_index: list[int] = []
    for w, (word, tag) in enumerate(zip(words, tags)):
        pieces = tokenizer.encode(word) or [tokenizer.unk_id]
        if len(ids) + len(pieces) > max_len - 2:
            break  # later words are cut off; they are predicted "O"
        ids += pieces
        labels += [tag] + [IGNORE] * (len(pieces) - 1)
        word_index += [w] + [-1] * (len(pieces) - 1)
    out = pack(tokenizer, ids, [], max_len, layout)
    start = layout.place(len(ids), 0, max_len)[0]
    out["labels"] = np.full(max_len, IGNORE, np.int32)
    out["labels"][start:start + len(ids)] = labels
    out["word_index"] = np.full(max_len, -1, np.int32)
    out["word_index"][start:start + len(ids)] = word_index
    return out


def encode_choices(tokenizer: Tokenizer, context: str, endings: Sequence[str], max_len: int,
                   layout: Layout = BERT_LAYOUT) -> dict[str, np.ndarray]:
    return stack([encode_pair(tokenizer, context, ending, max_len, layout) for ending in endings])


def stack(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Rows of same-named arrays (or scalars) -> one array per name, rows along a new first axis."""
    return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
