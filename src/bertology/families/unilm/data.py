"""UniLM's pretraining data: `data.objective="unilm"` (`UniLMRows`), BERT's segment pairs mixed
per batch among the four mask kinds of the core's `Mask`, with n-gram masked-LM corruption. The
segment ids per kind are the network's (`model.UNILM_SEGMENTS`). Registered with the shared
registry (`bertology.data.transforms`), which finds it by importing this module.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data import masking
from bertology.data.examples import create_pair_instances
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, MaskedLM, noise_options, register
from bertology.errors import UserError
from bertology.families.unilm.model import UNILM_SEGMENTS
from bertology.models.transformer import Mask

# The paper's mix per batch (section 2.3): 1/3 bidirectional, 1/3 seq2seq, 1/6 each direction.
UNILM_MIX = {"bidirectional": 1 / 3, "left_to_right": 1 / 6, "right_to_left": 1 / 6, "seq2seq": 1 / 3}


def mask_kind_counts(rows: int, shares: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """How many of `rows` rows get each kind: floor(rows · share) or one more, the extra rows
    going to kind k with probability equal to its fractional part (systematic sampling), so
    every batch is as close to the shares as whole rows allow and each kind's expected count is
    exactly rows · share (a 32-row batch is not a multiple of 6)."""
    exact = rows * np.asarray(shares, np.float64) / np.sum(shares)
    counts = np.floor(exact).astype(np.int64)
    edges = np.concatenate([[0.0], np.cumsum(exact - counts)])
    edges[-1] = rows - counts.sum()  # an integer; exact against rounding
    u = rng.random()  # the extra rows sit at u, u + 1, ...: kind k gets those in (edges[k], edges[k + 1]]
    return counts + (np.floor(edges[1:] - u) - np.floor(edges[:-1] - u)).astype(np.int64)


def unilm_ngrams(candidate: np.ndarray, budget: np.ndarray, max_predictions: int, rng: np.random.Generator,
                 ngram_prob: float, max_ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """UniLM's choice of masked positions (unilm-v1 `skipgram_prb`/`skipgram_size`): start
    positions in random order; from each, with probability `ngram_prob` an n-gram of n uniform in
    2 ... max_ngram tokens, else one token; an n-gram stops at a non-candidate token or when the
    row's `budget` is reached. Returns ascending [rows, max_predictions] positions (0-padded) and
    their weights, as `masking.mask_tokens` does."""
    rows, length = candidate.shape
    positions = np.full((rows, max_predictions), length, np.int64)
    for r in range(rows):
        chosen: list[int] = []
        taken = np.zeros(length, bool)
        for start in rng.permutation(np.flatnonzero(candidate[r])):
            if len(chosen) >= budget[r]:
                break
            n = int(rng.integers(2, max_ngram + 1)) if rng.random() < ngram_prob else 1
            for p in range(start, min(start + n, length)):
                if not candidate[r, p] or len(chosen) >= budget[r]:
                    break
                if not taken[p]:
                    taken[p] = True
                    chosen.append(p)
        positions[r, : len(chosen)] = np.sort(chosen)
    weights = positions < length
    return np.where(weights, positions, 0).astype(np.int32), weights


@register("unilm")
class UniLMRows(MaskedLM):
    """UniLM's rows (Dong et al. 2019): BERT's segment pairs `[CLS] A [SEP] B [SEP]` where B
    always follows A (no NSP), each batch split among the four mask kinds by data.noise shares
    (default `UNILM_MIX`), masked afresh every batch (data.masking must be dynamic).

    Per row: `mask_kind` (an index into `Mask.KINDS`), `segment_ids` per `UNILM_SEGMENTS`, and
    for sequence-to-sequence rows `prefix_length` = |A| + 2 (A is the source, B the target;
    0 on other rows). Masking takes BERT's budget (data.masked_lm_prob of the tokens, at most
    data.max_predictions_per_seq) over both segments of every kind, as the paper pretrains,
    choosing n-grams by `unilm_ngrams` (data.noise.ngram_prob 0.2, max_ngram 3: the paper's
    "20% of the time a bigram or a trigram") and corrupting them 80/10/10 (data.mask_prob,
    data.random_prob). The loss is the MLM loss at the masked positions, each under its row's mask.
    """

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        if not self.per_batch:
            raise UserError("data.objective='unilm' draws mask kinds and masks for every batch; "
                            "set data.masking=dynamic")
        options = noise_options(cfg, {**UNILM_MIX, "ngram_prob": 0.2, "max_ngram": 3})
        self.shares = [float(options[k]) for k in Mask.KINDS]
        if min(self.shares) < 0 or sum(self.shares) <= 0:
            raise UserError(f"data.noise mask-kind shares {dict(zip(Mask.KINDS, self.shares))} must be >= 0 with a "
                            "positive sum; e.g. the paper's 1/3, 1/6, 1/6, 1/3")
        self.ngram_prob, self.max_ngram = float(options["ngram_prob"]), int(options["max_ngram"])
        if not 0 <= self.ngram_prob <= 1 or self.max_ngram < 2:
            raise UserError(f"data.noise.ngram_prob={self.ngram_prob} / max_ngram={self.max_ngram}: use a probability "
                            "and an n-gram length of at least 2 (the paper: 0.2 and 3)")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        tok = self.tokenizer
        inst = create_pair_instances(documents, max_seq_length=self.cfg.max_seq_length,
                                     short_seq_prob=self.cfg.short_seq_prob, cls_id=tok.cls_id, sep_id=tok.sep_id,
                                     pad_id=tok.pad_id, rng=rng, nsp=False)
        return {"input_ids": inst.input_ids, "segment_ids": inst.segment_ids, "input_mask": inst.input_mask}

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        o = self.mask_options
        ids, special, candidate, budget = masking.prepare(
            batch["input_ids"], o["special_ids"], o["vocab_size"], o["max_predictions"], o["masked_lm_prob"],
            o["mask_prob"], o["random_prob"], o["pad_id"])
        positions, weights = unilm_ngrams(candidate, budget, o["max_predictions"], rng, self.ngram_prob,
                                          self.max_ngram)
        masked = masking.corrupt(ids, positions, weights, rng, vocab_size=o["vocab_size"], mask_id=o["mask_id"],
                                 special=special, mask_prob=o["mask_prob"], random_prob=o["random_prob"])
        rows = len(ids)
        kinds = rng.permutation(np.repeat(np.arange(len(Mask.KINDS)), mask_kind_counts(rows, self.shares, rng)))
        second = batch["segment_ids"] > 0
        first_ids = np.array([UNILM_SEGMENTS[k][0] for k in Mask.KINDS])[kinds][:, None]
        second_ids = np.array([UNILM_SEGMENTS[k][1] for k in Mask.KINDS])[kinds][:, None]
        segments = np.where(second, second_ids, first_ids) * (batch["input_mask"] > 0)
        source = np.count_nonzero((batch["input_mask"] > 0) & ~second, axis=1)
        seq2seq = kinds == Mask.KINDS.index("seq2seq")
        return {**batch, **masked, "segment_ids": segments.astype(np.int32), "mask_kind": kinds.astype(np.int32),
                "prefix_length": np.where(seq2seq, source, 0).astype(np.int32)}
