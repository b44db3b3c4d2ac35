"""Fine-tuning's training rows as an endless, resumable stream of batches."""

from __future__ import annotations

from typing import Any

import numpy as np


class ShuffledRows:
    """Endless batches of training rows: the concatenation of successive permutations of the
    rows (one Generator seeded once), cut into batches, so small sets wrap around. Its position
    is one number, so a resumed run replays the same permutations and continues where it stopped."""

    def __init__(self, arrays: dict[str, np.ndarray], batch_size: int, seed: int):
        self.arrays, self.batch_size, self.seed = arrays, batch_size, seed
        self.n = len(next(iter(arrays.values())))
        self.set_state({"position": 0})

    def set_state(self, state: dict[str, Any]) -> None:
        self.position = state["position"]
        self._rng = np.random.default_rng(self.seed)
        self._pass, self._order = -1, np.zeros(0, np.int64)
        self._advance_to(self.position // self.n)

    def get_state(self) -> dict[str, Any]:
        return {"position": self.position}

    def _advance_to(self, p: int) -> None:
        while self._pass < p:
            self._order, self._pass = self._rng.permutation(self.n), self._pass + 1

    def __next__(self) -> dict[str, np.ndarray]:
        pieces, need = [], self.batch_size
        while need:
            self._advance_to(self.position // self.n)
            start = self.position % self.n
            pieces.append(self._order[start:start + need])
            self.position += len(pieces[-1])
            need -= len(pieces[-1])
        rows = np.concatenate(pieces)
        return {k: v[rows] for k, v in self.arrays.items()}
