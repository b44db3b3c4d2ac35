"""ERNIE-style knowledge masking needs to know where phrases and entities are.

ERNIE (Baidu) took phrase and entity boundaries from a chunker and an entity recogniser; here a
lexicon file (one phrase or entity per line) and a longest-match scan over word starts stand in
for them, which is enough to mask multi-word units as wholes.
"""

from __future__ import annotations

import pathlib

import numpy as np

from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError


class LexiconMatcher:
    """Finds lexicon entries in rows of token ids, longest match first, on word boundaries."""

    def __init__(self, path: str | pathlib.Path, tokenizer: Tokenizer):
        path = pathlib.Path(path)
        if not path.is_file():
            raise UserError(f"lexicon not found: {path}; give a text file with one phrase or entity per line")
        self.tokenizer = tokenizer
        self.entries: dict[int, list[tuple[int, ...]]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            ids = tuple(tokenizer.encode(line.strip())) if line.strip() else ()
            if len(ids) >= 2:  # single tokens are ordinary words already
                self.entries.setdefault(ids[0], []).append(ids)
        if not self.entries:
            raise UserError(f"lexicon {path} has no multi-token entries; add phrases or entities, one per line")
        for seqs in self.entries.values():
            seqs.sort(key=len, reverse=True)

    def spans(self, row: np.ndarray) -> list[tuple[int, int]]:
        """Non-overlapping [start, end) token ranges of matches that start and end on word boundaries."""
        starts = self.tokenizer.word_starts(row)
        boundary = np.append(starts[1:], True)  # a match must end where the next word starts
        found, i, ids = [], 0, row.tolist()
        while i < len(ids):
            match = next((s for s in self.entries.get(ids[i], ()) if starts[i] and tuple(ids[i : i + len(s)]) == s
                          and boundary[i + len(s) - 1]), None)
            if match:
                found.append((i, i + len(match)))
                i += len(match)
            else:
                i += 1
        return found
