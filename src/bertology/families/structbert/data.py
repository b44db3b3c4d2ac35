"""StructBERT's pretraining rows: `data.objective="structbert"` (`StructBERTRows`), registered with
the shared registry (`bertology.data.transforms`), which finds it by importing this module.

- Sentence structure: BERT's segment pairs with three labels (`create_pair_instances`'
  `sentence_structure`): B follows A (0), B precedes A (1: the true pair swapped), B from
  another document (2), about a third each.
- Word structure: after BERT's masking, `data.shuffle_trigrams` (the paper's 5%) of the trigrams
  that hold no masked and no special token are shuffled in place, and their positions join the
  prediction slots (where the row has room), each predicting its original token (`shuffled` marks
  them, for the objective's separate term).
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data.examples import create_pair_instances
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, MaskedLM, register
from bertology.errors import UserError

# the permutations of three positions that move at least one token (a shuffle that changes the row)
_SHUFFLES = np.array([p for p in ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))])


def shuffle_trigrams(batch: Batch, rng: np.random.Generator, *, fraction: float, special_ids: Sequence[int]) -> Batch:
    """The word structural objective on masked rows (`mask_tokens`' keys): in each row, `fraction`
    of the trigrams with no masked slot and no special token (at least one where there is any),
    non-overlapping, shuffled by a permutation that moves a token; their three positions fill
    free prediction slots (a row with fewer than three free slots shuffles fewer), the slots kept
    in ascending position. Adds `shuffled` (1.0 at those slots)."""
    ids = batch["input_ids"].copy()
    positions, targets = batch["masked_positions"].copy(), batch["masked_ids"].copy()
    weights = batch["masked_weights"].copy()
    shuffled = np.zeros_like(weights)
    rows, length = ids.shape
    for r in range(rows):
        free = np.ones(length, bool)
        free[positions[r][weights[r] > 0]] = False
        free &= ~np.isin(ids[r], special_ids) & (batch["input_mask"][r] > 0)
        starts = np.flatnonzero(free[:-2] & free[1:-1] & free[2:])
        room = int((weights[r] == 0).sum()) // 3
        want = min(room, max(1, round(fraction * len(starts)))) if len(starts) else 0
        chosen: list[int] = []
        for start in rng.permutation(starts):
            if len(chosen) == want:
                break
            if all(abs(start - c) >= 3 for c in chosen):
                chosen.append(int(start))
        slots = np.flatnonzero(weights[r] == 0)
        for k, start in enumerate(chosen):
            span = np.arange(start, start + 3)
            original = ids[r, span].copy()
            ids[r, span] = original[_SHUFFLES[rng.integers(len(_SHUFFLES))]]
            positions[r, slots[3 * k:3 * k + 3]], targets[r, slots[3 * k:3 * k + 3]] = span, original
            weights[r, slots[3 * k:3 * k + 3]], shuffled[r, slots[3 * k:3 * k + 3]] = 1.0, 1.0
        order = np.argsort(np.where(weights[r] > 0, positions[r], length + 1), kind="stable")
        positions[r], targets[r], weights[r], shuffled[r] = positions[r][order], targets[r][order], weights[r][order], \
            shuffled[r][order]
    return {**batch, "input_ids": ids, "masked_positions": positions, "masked_ids": targets, "masked_weights": weights,
            "shuffled": shuffled}


@register("structbert")
class StructBERTRows(MaskedLM):
    """BERT's segment pairs with StructBERT's three sentence labels (`sentence_label`) and, after
    BERT's masking, its shuffled trigrams (see the module docstring)."""

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        if self.kind != "pairs":
            raise UserError(f"data.objective='structbert' makes segment pairs, not {self.kind!r}; "
                            "set data.instances='pairs'")
        self.fraction = cfg.get("shuffle_trigrams", 0.05)
        if not 0.0 <= self.fraction <= 1.0:
            raise UserError(f"data.shuffle_trigrams={self.fraction} is not a fraction; use a value in [0, 1] (paper: 0.05)")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        tok = self.tokenizer
        inst = create_pair_instances(documents, max_seq_length=self.cfg.max_seq_length,
                                     short_seq_prob=self.cfg.short_seq_prob, cls_id=tok.cls_id, sep_id=tok.sep_id,
                                     pad_id=tok.pad_id, rng=rng, sentence_structure=True)
        return {"input_ids": inst.input_ids, "segment_ids": inst.segment_ids, "input_mask": inst.input_mask,
                "sentence_label": inst.next_sentence_label}

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        return shuffle_trigrams(super().corrupt(batch, rng), rng, fraction=self.fraction,
                                special_ids=self.mask_options["special_ids"])
