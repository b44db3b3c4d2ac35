"""ERNIE-style knowledge masking needs to know where phrases and entities are.

ERNIE (Baidu) took phrase and entity boundaries from a chunker and an entity recogniser; here a
lexicon file (one phrase or entity per line) and a longest-match scan over word starts stand in
for them, which is enough to mask multi-word units as wholes.
"""

from __future__ import annotations

import pathlib
from typing import Iterable, TypeVar

import numpy as np

from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError

V = TypeVar("V")
Entries = dict[int, list[tuple[tuple[int, ...], V]]]


def index_entries(entries: Iterable[tuple[tuple[int, ...], V]]) -> Entries[V]:
    """(token ids, value) pairs by their first token, longest first (ties in the order given): what
    `longest_matches` scans with."""
    by_first: Entries[V] = {}
    for ids, value in entries:
        by_first.setdefault(ids[0], []).append((ids, value))
    for candidates in by_first.values():
        candidates.sort(key=lambda entry: len(entry[0]), reverse=True)
    return by_first


def longest_matches(entries: Entries[V], row: np.ndarray, tokenizer: Tokenizer) -> list[tuple[int, int, V]]:
    """Non-overlapping (start, end, value) matches of `entries` in a row of token ids, left to right,
    the longest entry at each position, each starting and ending on a word boundary."""
    starts = tokenizer.word_starts(row)
    boundary = np.append(starts[1:], True)  # a match must end where the next word starts
    found, i, ids = [], 0, row.tolist()
    while i < len(ids):
        match = next(((s, v) for s, v in entries.get(ids[i], ()) if starts[i] and tuple(ids[i : i + len(s)]) == s
                      and boundary[i + len(s) - 1]), None)
        if match:
            found.append((i, i + len(match[0]), match[1]))
            i += len(match[0])
        else:
            i += 1
    return found


class LexiconMatcher:
    """Finds lexicon entries in rows of token ids, longest match first, on word boundaries."""

    def __init__(self, path: str | pathlib.Path, tokenizer: Tokenizer):
        path = pathlib.Path(path)
        if not path.is_file():
            raise UserError(f"lexicon not found: {path}; give a text file with one phrase or entity per line")
        self.tokenizer = tokenizer
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        encoded = [tuple(tokenizer.encode(line)) for line in lines]
        # single tokens are ordinary words already
        self.entries: Entries[None] = index_entries((ids, None) for ids in encoded if len(ids) >= 2)
        if not self.entries:
            raise UserError(f"lexicon {path} has no multi-token entries; add phrases or entities, one per line")

    def spans(self, row: np.ndarray) -> list[tuple[int, int]]:
        """Non-overlapping [start, end) token ranges of matches that start and end on word boundaries."""
        return [(start, end) for start, end, _ in longest_matches(self.entries, row, self.tokenizer)]
