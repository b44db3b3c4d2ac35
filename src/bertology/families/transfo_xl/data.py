"""Transformer-XL's pretraining data: `data.objective="contiguous_lm"` (`ContiguousLM`), one
token stream cut into lanes (`bertology.data.lanes`) that the memory carries across; the LSTM
LM (`configs/lstm_lm.py`) reads it too, as it trains with this family's objective. Registered
with the shared registry (`bertology.data.transforms`), which finds it by importing this module.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertology.data import lanes
from bertology.data.transforms import Batch, Document, Transform, next_token_targets, register
from bertology.errors import UserError


@register("contiguous_lm")
class ContiguousLM(Transform):
    """Transformer-XL's lanes (kimiyoung/transformer-xl `LMOrderedIterator`): the documents in
    order, each its sentences followed by the tokenizer's eos, as one token stream in which every
    token predicts the next, across sentence, document and segment boundaries (the memory carries
    the context over a segment boundary; only the stream's last token has no target). `lanes.cut`
    cuts it into data.max_seq_length-token segments of `lanes` lanes.

    Keys [lanes, steps, length]: input_ids, targets, target_weights (1.0 but at the stream's end).
    No input_mask: every position is a real token."""

    contiguous = True

    # A contiguous transform's pass takes the lane count (`Transform`), so it overrides with one argument more.
    def instances(self, documents: Sequence[Document], rng: np.random.Generator, lanes_: int) -> Batch:  # type: ignore[override]
        eos = np.array([self.tokenizer.eos_id])
        pieces = [np.concatenate([*[s for s in doc if len(s)], eos]) for doc in documents if any(len(s) for s in doc)]
        if not pieces:
            raise UserError("the corpus holds no text; give it some")
        ids = np.concatenate(pieces).astype(np.int32)[None]
        stream = {"input_ids": ids, **next_token_targets(ids, np.ones_like(ids))}
        return lanes.cut({k: v[0] for k, v in stream.items()}, lanes_, self.cfg.max_seq_length, rng)
