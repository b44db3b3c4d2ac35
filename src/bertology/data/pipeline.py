"""From tokenized documents to global training batches, deterministically.

The stream is a sequence of *passes* over the training documents. Pass p is built from
`(seed, p)` alone: the objective's transform (`data.objective`, `transforms.py`) makes its
instances, which are shuffled and, for a transform that corrupts once per pass (static masking),
corrupted once. Static masking reuses pass p mod dupe_factor (the transform's `copies`), so
exactly dupe_factor differently masked copies of the data exist, as in BERT's
create_pretraining_data.py. Dynamic masking (RoBERTa) builds fresh pairs each pass and draws
fresh masks for each batch from `(seed, step)`.

The iterator state is three integers (pass, offset, step); it is saved with each checkpoint, so
a resumed run sees exactly the batches an uninterrupted run would. Every process computes the
same global batch order and keeps only its own rows.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data import transforms
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document
from bertology.errors import UserError

# Stream ids keep the random streams of different purposes independent for the same seed.
_PAIRS, _SHUFFLE, _MASK, _EVAL = 1, 2, 3, 4


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def make_instances(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                   rng: np.random.Generator) -> Batch:
    """Uncorrupted instances of one pass for the config's data.objective, in the transform's
    order (what a pass of the stream is built from; the benchmarks measure it alone)."""
    return transforms.make(cfg, tokenizer).instances(documents, rng)


class PretrainingStream:
    """Global batches of `batch_size` rows; this process gets rows [start, stop)."""

    def __init__(
        self,
        documents: Sequence[Document],
        tokenizer: Tokenizer,
        cfg: ml_collections.ConfigDict,
        *,
        batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        self.transform = transforms.make(cfg, tokenizer)
        if batch_size % process_count:
            raise UserError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
        self.documents = documents
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.batch_size = batch_size
        self.seed = seed
        rows = batch_size // process_count
        self.rows = slice(process_index * rows, (process_index + 1) * rows)
        self.state = {"pass": 0, "offset": 0, "step": 0}
        self._pass_id: int | None = None
        self._pass: Batch = {}

    def _build_pass(self, p: int) -> Batch:
        """Pass p: shuffled instances, corrupted now unless the transform corrupts each batch."""
        transform = self.transform
        source = p % transform.copies if transform.copies else p
        inst = transform.instances(self.documents, _rng(self.seed, _PAIRS, source))
        if len(inst["input_ids"]) == 0:
            raise UserError("the corpus produced no training instances; give it more text")
        order = _rng(self.seed, _SHUFFLE, source).permutation(len(inst["input_ids"]))
        inst = {k: v[order] for k, v in inst.items()}
        if not transform.per_batch:
            inst = transform.corrupt(inst, _rng(self.seed, _MASK, source))
        return inst

    def _current_pass(self) -> Batch:
        if self._pass_id != self.state["pass"]:
            self._pass = self._build_pass(self.state["pass"])
            self._pass_id = self.state["pass"]
        return self._pass

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        parts: list[Batch] = []
        need = self.batch_size
        while need:
            inst = self._current_pass()
            n = len(inst["input_ids"])
            take = min(need, n - self.state["offset"])
            lo = self.state["offset"]
            parts.append({k: v[lo : lo + take] for k, v in inst.items()})
            need -= take
            self.state["offset"] += take
            if self.state["offset"] == n:
                self.state["pass"] += 1
                self.state["offset"] = 0
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if self.transform.per_batch:
            batch = self.transform.corrupt(batch, _rng(self.seed, _MASK, self.state["step"]))
        self.state["step"] += 1
        return {k: v[self.rows] for k, v in batch.items()}

    def get_state(self) -> dict[str, int]:
        return dict(self.state)

    def set_state(self, state: dict[str, int]) -> None:
        self.state = {k: int(state[k]) for k in ("pass", "offset", "step")}


def eval_batches(
    documents: Sequence[Document],
    tokenizer: Tokenizer,
    cfg: ml_collections.ConfigDict,
    *,
    batch_size: int,
    num_batches: int,
    seed: int,
) -> list[Batch]:
    """A fixed list of held-out batches (corrupted once, e.g. masked), so eval numbers compare
    across steps and runs."""
    transform = transforms.make(cfg, tokenizer)
    inst = transform.instances(documents, _rng(seed, _EVAL, 0))
    n = len(inst["input_ids"])
    if n == 0:
        raise UserError("the validation split produced no instances; give the corpus more documents")
    idx = np.arange(batch_size * num_batches) % n
    inst = {k: v[idx] for k, v in inst.items()}
    inst = transform.corrupt(inst, _rng(seed, _EVAL, 1))
    return [{k: v[i * batch_size : (i + 1) * batch_size] for k, v in inst.items()} for i in range(num_batches)]
