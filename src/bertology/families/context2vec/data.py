"""context2vec's rows: `data.objective="context2vec"`, registered with the shared registry
(`bertology.data.transforms`), which finds it by importing this module.

A row is one sentence, `[CLS] words [SEP]` cut to `data.max_seq_length` (the reference trains on
sentences). Each word of a row gets `data.negatives` words (10 in the reference) drawn from the
unigram distribution raised to `data.ns_power` (0.75, word2vec's), counted over the rows of the
pass; as static masking does, `data.dupe_factor` passes draw their own negatives, then repeat.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology import validation
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, Transform, register


@register("context2vec")
class SentenceRows(Transform):
    """One sentence per row, with each word's negative samples (`negatives` [rows, length, k])."""

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        k, power = validation.get(config, "data.negatives"), validation.get(config, "data.ns_power")
        if k is not validation.MISSING and not (isinstance(k, int) and k >= 1):
            raise validation.refuse("data.negatives", k, "must be a positive integer", "use 10, as the reference")
        if power is not validation.MISSING and not (isinstance(power, (int, float)) and power >= 0):
            raise validation.refuse("data.ns_power", power, "must be >= 0", "use 0.75, word2vec's (0: uniform)")
        length = validation.get(config, "data.max_seq_length")
        if isinstance(length, int) and length < 3:
            raise validation.refuse("data.max_seq_length", length, "leaves no word between [CLS] and [SEP]", "use at least 3")

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        self.copies = cfg.get("dupe_factor", 10)  # passes with their own negatives before they repeat

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        length, tok = self.cfg.max_seq_length, self.tokenizer
        sentences = [s for doc in documents for s in doc if len(s)]
        ids = np.full((len(sentences), length), tok.pad_id, np.int32)
        mask = np.zeros_like(ids)
        for r, s in enumerate(sentences):
            body = np.asarray(s[: length - 2], np.int32)
            ids[r, : len(body) + 2] = np.concatenate([[tok.cls_id], body, [tok.sep_id]])
            mask[r, : len(body) + 2] = 1
        return {"input_ids": ids, "input_mask": mask}

    def noise(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The negatives' distribution over the vocabulary: count^ns_power of the rows' words."""
        counts = np.bincount(ids[mask > 0], minlength=self.tokenizer.vocab_size).astype(np.float64)
        counts[sorted(self.tokenizer.special_ids)] = 0.0  # [CLS]/[SEP]/[PAD] are never targets
        weights = counts ** self.cfg.get("ns_power", 0.75) * (counts > 0)
        return weights / weights.sum()

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        ids, mask = batch["input_ids"], batch["input_mask"]
        p = self.noise(ids, mask)
        negatives = rng.choice(len(p), size=(*ids.shape, self.cfg.get("negatives", 10)), p=p)
        return {**batch, "negatives": negatives.astype(np.int32)}
