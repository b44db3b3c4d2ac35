"""Contiguous data: the corpus as one token stream cut into parallel lanes, for recurrent state.

A family that carries state from one batch to the next (ELMo's LSTM states, Transformer-XL's
memory) needs row b of step t + 1 to continue row b of step t. A transform with `contiguous = True`
(`data/transforms.py`; each of them lives in its family's `data.py`) builds each pass as the
documents in order, joined into one stream, made into per-token keys (ids, targets, ...) and cut
by `cut` into `lanes` = global batch size lanes of `steps` segments of `length` tokens: arrays
[lanes, steps, length, ...], as Transformer-XL's `batchify` and XLNet's data do. `LanesStream`
yields step t of a pass as `arr[rows, t]` (this process's rows) with a per-row int32
`carry_reset`, 1 on the first step of a pass: the train step zeroes the carry of those rows
(`bertology.train.step`).

Pass p is built from (seed, p) alone and starts the stream at an offset drawn from that pass's
rng, so a new pass cuts the segments at other places (no lane re-reads the same cut). Each batch
is `corrupt`ed with the rng of its step (char-id lookup, masking), never a whole pass at once.
The position is three integers (pass, offset, step), saved with each checkpoint: a resumed run
sees exactly the batches, and its restored carry continues exactly the lanes, of an
uninterrupted one.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bertology.data.transforms import Batch, Document, Transform
from bertology.errors import UserError

# Stream ids keep the random streams of different purposes independent for the same seed.
_PASS, _CORRUPT, _EVAL = 1, 3, 4


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def cut(stream: Batch, lanes: int, length: int, rng: np.random.Generator) -> Batch:
    """Per-token arrays [N, ...] of one stream -> [lanes, steps, length, ...]: the stream from an
    offset in [0, length) drawn from `rng` on, split into `lanes` equal contiguous lanes, each cut
    into `steps` segments (the first `offset` tokens, and each lane's tail that fills no whole
    segment, are left out)."""
    offset = int(rng.integers(length))
    n = len(next(iter(stream.values()))) - offset
    steps = n // lanes // length
    if steps == 0:
        raise UserError(f"the corpus holds {n} tokens, too few for {lanes} lanes of {length}-token segments; "
                        "give it more text, or lower batch_size or data.max_seq_length")
    per_lane = n // lanes
    return {k: v[offset:offset + lanes * per_lane].reshape(lanes, per_lane, *v.shape[1:])[:, :steps * length]
            .reshape(lanes, steps, length, *v.shape[1:]) for k, v in stream.items()}


class LanesStream:
    """Global batches of `batch_size` lanes, one segment each, continuing the lanes of the batch
    before; this process gets rows [start, stop)."""

    def __init__(
        self,
        transform: Transform,
        documents: Sequence[Document],
        *,
        batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if batch_size % process_count:
            raise UserError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
        self.transform = transform
        self.documents = documents
        self.batch_size = batch_size
        self.seed = seed
        rows = batch_size // process_count
        self.rows = slice(process_index * rows, (process_index + 1) * rows)
        self.state = {"pass": 0, "offset": 0, "step": 0}
        self._pass_id: int | None = None
        self._pass: Batch = {}

    def _current_pass(self) -> Batch:
        if self._pass_id != self.state["pass"]:
            p = self.state["pass"]
            lanes = self.transform.instances(self.documents, _rng(self.seed, _PASS, p), self.batch_size)
            self._pass = {k: v[self.rows] for k, v in lanes.items()}
            self._pass_id = p
        return self._pass

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        lanes = self._current_pass()
        t = self.state["offset"]
        batch = {k: v[:, t] for k, v in lanes.items()}
        batch = self.transform.corrupt(batch, _rng(self.seed, _CORRUPT, self.state["step"]))
        rows = len(next(iter(batch.values())))
        batch["carry_reset"] = np.full(rows, int(t == 0), np.int32)
        self.state["step"] += 1
        self.state["offset"] += 1
        if self.state["offset"] == next(iter(lanes.values())).shape[1]:
            self.state["pass"] += 1
            self.state["offset"] = 0
        return batch

    def get_state(self) -> dict[str, int]:
        return dict(self.state)

    def set_state(self, state: dict[str, Any]) -> None:
        self.state = {k: int(state[k]) for k in ("pass", "offset", "step")}


def eval_batches(transform: Transform, documents: Sequence[Document], *, batch_size: int, num_batches: int,
                 seed: int) -> list[Batch]:
    """The first `num_batches` steps (fewer if the held-out lanes are shorter) of the held-out
    documents' lanes, in order: evaluation carries its state from each to the next."""
    lanes = transform.instances(documents, _rng(seed, _EVAL, 0), batch_size)
    steps = min(num_batches, next(iter(lanes.values())).shape[1])
    return [transform.corrupt({k: v[:, t] for k, v in lanes.items()}, _rng(seed, _EVAL, 1, t)) for t in range(steps)]
