"""Quick-Thought's rows: `data.objective="quick_thought"`, registered with the shared registry
(`bertology.data.transforms`), which finds it by importing this module.

A row is `data.sentences_per_row` consecutive sentences of one document, each `[CLS] sentence
[SEP]` cut to `data.max_seq_length` ([rows, sentences, length]; a document's last row may hold
fewer, its empty slots all padding). The stream shuffles whole rows, so a sentence's neighbours
stay in its row while the batch's other rows supply the distractors.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology import validation
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, Transform, register
from bertology.errors import UserError


@register("quick_thought")
class QuickThoughtRows(Transform):
    """Rows of consecutive sentences (see the module docstring); deterministic: `rng` is unused."""

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """The candidates are the batch's sentences, so microbatches would change the objective."""
        steps = validation.get(config, "grad_accum_steps")
        if steps not in (validation.MISSING, 1):
            raise validation.refuse("grad_accum_steps", steps, "would split the batch whose sentences are each "
                                    "other's candidates (Quick-Thought)", "set --config.grad_accum_steps=1 and raise "
                                    "batch_size instead")

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        self.per_row = cfg.get("sentences_per_row", 8)
        if self.per_row < 2:
            raise UserError(f"data.sentences_per_row={self.per_row}: a sentence needs a neighbour in its row; use 2 or more")
        if cfg.max_seq_length < 3:
            raise UserError(f"data.max_seq_length={cfg.max_seq_length} leaves no room for a sentence; use at least 3")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        length, tok = self.cfg.max_seq_length, self.tokenizer
        rows = []
        for doc in documents:
            sentences = [s for s in doc if len(s)]
            chunks = (sentences[i:i + self.per_row] for i in range(0, len(sentences), self.per_row))
            rows += [chunk for chunk in chunks if len(chunk) >= 2]
        ids = np.full((len(rows), self.per_row, length), tok.pad_id, np.int32)
        mask = np.zeros_like(ids)
        for r, row in enumerate(rows):
            for k, s in enumerate(row):
                body = np.asarray(s[: length - 2], np.int32)
                ids[r, k, : len(body) + 2] = np.concatenate([[tok.cls_id], body, [tok.sep_id]])
                mask[r, k, : len(body) + 2] = 1
        return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
