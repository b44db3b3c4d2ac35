"""Examples to model inputs: [CLS] a [SEP] (b [SEP]), padded to a fixed length.

Pairs are truncated as the reference BERT code does: drop the last token of the longer side
until the pair fits. Token classification labels only the first sub-word of each word (the
others get -1 and no loss), so word-level predictions are read off first sub-words. Multiple
choice encodes (context, ending) once per ending into a [choices, length] block.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bertology.data.tokenizers import Tokenizer

IGNORE = -1  # label of positions that carry no loss


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def pack(tokenizer: Tokenizer, a: Sequence[int], b: Sequence[int], max_len: int) -> dict[str, np.ndarray]:
    """input_ids / input_mask / segment_ids of [CLS] a [SEP] (b [SEP]), zero-padded to max_len."""
    ids = [tokenizer.cls_id, *a, tokenizer.sep_id]
    segments = [0] * len(ids)
    if b:
        ids += [*b, tokenizer.sep_id]
        segments += [1] * (len(b) + 1)
    if len(ids) > max_len:
        raise ValueError(f"{len(ids)} tokens do not fit max_len {max_len}; truncate first")
    pad = max_len - len(ids)
    return {
        "input_ids": np.array(ids + [tokenizer.pad_id] * pad, np.int32),
        "input_mask": np.array([1] * len(ids) + [0] * pad, np.int32),
        "segment_ids": np.array(segments + [0] * pad, np.int32),
    }


def encode_pair(tokenizer: Tokenizer, text_a: str, text_b: str, max_len: int) -> dict[str, np.ndarray]:
    a, b = tokenizer.encode(text_a), tokenizer.encode(text_b) if text_b else []
    a, b = truncate_pair(a, b, max_len - (3 if b else 2))
    return pack(tokenizer, a, b, max_len)


def encode_words(tokenizer: Tokenizer, words: Sequence[str], tags: Sequence[int], max_len: int) -> dict[str, np.ndarray]:
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
    out = pack(tokenizer, ids, [], max_len)
    pad = max_len - len(ids) - 2
    out["labels"] = np.array([IGNORE, *labels, IGNORE] + [IGNORE] * pad, np.int32)
    out["word_index"] = np.array([-1, *word_index, -1] + [-1] * pad, np.int32)
    return out


def encode_choices(tokenizer: Tokenizer, context: str, endings: Sequence[str], max_len: int) -> dict[str, np.ndarray]:
    return stack([encode_pair(tokenizer, context, ending, max_len) for ending in endings])


def stack(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Rows of same-named arrays (or scalars) -> one array per name, rows along a new first axis."""
    return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
