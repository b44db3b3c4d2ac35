"""Sequence packing for single-segment families (RoBERTa, SpanBERT, GPT): several documents per row.

One document per row wastes the tail of every row on padding. Packing puts several documents
(each `[CLS] tokens [SEP]`, or for causal LMs `tokens eos`, cut into pieces of at most
`max_seq_length` tokens) into one row and
keeps them apart in the model: `packing_ids` numbers the pieces of a row 1, 2, ... (0 on
padding), which the model's attention mask (`Mask.from_batch`) turns into a block-diagonal mask, and
`positions` restart at each piece, so every piece is encoded exactly as it would be alone.

Rows are filled best-fit-decreasing (longest piece first, into the row with the least room that
still fits it), which is deterministic and leaves almost no padding on real corpora.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

from bertology.errors import UserError

Batch = dict[str, np.ndarray]


def document_pieces(
    documents: Sequence[Sequence[np.ndarray]], max_seq_length: int, cls_id: int, sep_id: int
) -> list[np.ndarray]:
    """Each document's tokens as `[CLS] ... [SEP]` pieces of at most `max_seq_length` tokens."""
    if max_seq_length < 3:
        raise UserError(f"max_seq_length {max_seq_length} is too short to pack; it needs room for [CLS] x [SEP]")
    body = max_seq_length - 2
    pieces = []
    for doc in documents:
        tokens = np.concatenate([np.asarray(s, np.int32) for s in doc]) if len(doc) else np.zeros(0, np.int32)
        for start in range(0, len(tokens), body):
            pieces.append(np.concatenate([[cls_id], tokens[start : start + body], [sep_id]]).astype(np.int32))
    return pieces


def causal_pieces(documents: Sequence[Sequence[np.ndarray]], max_seq_length: int, eos_id: int) -> list[np.ndarray]:
    """Each document's tokens followed by `eos_id`, cut into pieces of at most `max_seq_length`
    tokens, consecutive pieces overlapping by one token; documents without tokens are skipped.

    Why the overlap: attention never crosses pieces, so a piece's last token has no target, and
    without overlap the prediction of the first token after every cut would be lost. Starting the
    next piece with the cut's last token keeps it: every token of a document but its first is a
    target exactly once, for one repeated input token per cut (1 in max_seq_length - 1). The
    repeated token starts its piece without context, as a document's first token does. Every
    piece has at least two tokens, so at least one target.
    """
    if max_seq_length < 2:
        raise UserError(f"max_seq_length {max_seq_length} is too short for language modelling; use at least 2")
    step = max_seq_length - 1
    pieces = []
    for doc in documents:
        sentences = [np.asarray(s, np.int32) for s in doc if len(s)]
        if not sentences:
            continue
        tokens = np.concatenate([*sentences, np.array([eos_id], np.int32)])
        pieces.extend(tokens[start : start + max_seq_length] for start in range(0, len(tokens) - 1, step))
    return pieces


def assign_rows(lengths: Sequence[int], max_seq_length: int) -> list[list[int]]:
    """Best-fit decreasing: the piece indices of each row, in the order they were placed."""
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # sorted (space left, row index)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if n > max_seq_length:
            raise UserError(f"piece {i} has {n} tokens, more than max_seq_length {max_seq_length}")
        at = bisect.bisect_left(room, (n, -1))
        if at == len(room):
            rows.append([i])
            left, row = max_seq_length - n, len(rows) - 1
        else:
            left, row = room.pop(at)
            rows[row].append(i)
            left -= n
        bisect.insort(room, (left, row))
    return rows


def pack(pieces: Sequence[np.ndarray], max_seq_length: int, pad_id: int = 0) -> Batch:
    """Rows of packed pieces: input_ids, input_mask, packing_ids (1, 2, ...; 0 pad), positions."""
    return _fill(assign_rows([len(p) for p in pieces], max_seq_length), pieces, max_seq_length, pad_id)


def one_per_row(pieces: Sequence[np.ndarray], max_seq_length: int, pad_id: int = 0) -> Batch:
    """The unpacked layout (one piece per row) in the same format, to compare against."""
    return _fill([[i] for i in range(len(pieces))], pieces, max_seq_length, pad_id)


def padding_fraction(input_mask: np.ndarray) -> float:
    """Share of token slots that are padding."""
    return float(1.0 - np.asarray(input_mask).mean()) if np.asarray(input_mask).size else 0.0


def _fill(rows: list[list[int]], pieces: Sequence[np.ndarray], length: int, pad_id: int) -> Batch:
    out = {
        "input_ids": np.full((len(rows), length), pad_id, np.int32),
        "input_mask": np.zeros((len(rows), length), np.int32),
        "packing_ids": np.zeros((len(rows), length), np.int32),
        "positions": np.zeros((len(rows), length), np.int32),
    }
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members, start=1):
            n = len(pieces[i])
            out["input_ids"][r, at : at + n] = pieces[i]
            out["input_mask"][r, at : at + n] = 1
            out["packing_ids"][r, at : at + n] = k
            out["positions"][r, at : at + n] = np.arange(n)  # the encoder adds its position_offset
            at += n
    return out
