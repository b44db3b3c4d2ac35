"""XLNet's pretraining data: `data.objective="xlnet"` (`XLNetRows`), [reuse | A <sep> B <sep>
<cls>] rows over contiguous lanes with permutation masks drawn every batch, by the rules of
`bertology.data.permutation`. Registered with the shared registry (`bertology.data.transforms`),
which finds it by importing this module.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology import validation
from bertology.data import permutation
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, Transform, register
from bertology.errors import UserError


@register("xlnet")
class XLNetRows(Transform):
    """XLNet's pretraining rows (zihangdai/xlnet `data_utils.py`, rules in `data/permutation.py`).

    Contiguous: `instances(documents, rng, lanes)` returns arrays [lanes, steps, ...]. The corpus is
    one token stream (documents in order, sentences alternating sentence ids, the tokenizer's eos
    ending each document inside its last sentence, as the reference's `<eod>` with use_eod) cut into
    lanes (`batchify`). Step t of a lane is `lane[t·R : (t+1)·R]` (R = data.reuse_len: the part the
    model caches as memory, so step t+1's reused part continues step t's) followed by A `<sep>` B
    `<sep>` `<cls>` (`permutation.split_a_and_b`, A starting at `lane[(t+1)·R]`), data.max_seq_length
    tokens in all, no padding; segment ids 0 up to the first `<sep>`, 1 up to the second, 2 on `<cls>`.
    A lane ends at the first step where any lane runs out of text, as the reference cuts its batches.

    data.bi_data (default True, the reference's): the stream is cut into lanes/2 lanes and rows
    lanes/2 + b are lane b reversed (the reference puts forward and reversed lanes in the two halves
    of each core's batch; here the halves of the global batch: row b < lanes/2 is forward). Spans on
    a reversed lane are drawn on it read forwards (the reference's `reverse=True`), so they still
    start at word starts. The model negates the relative positions of the second half.

    Targets (`permutation.span_targets`, data.mask_alpha K = 6, data.mask_beta 1, data.num_predict
    = max_seq_length·beta/alpha, 85 at 512) are drawn once per pass and kept as `is_masked`:
    ceil(P/2) in the reused part, floor(P/2) in the rest. `corrupt` (every batch, as the reference's
    input parser draws the factorisation order on every read) turns them into perm_mask [L, L] int8
    (1 = may NOT attend; `permutation.row_perm_mask`, data.perm_size, default R), target_mapping
    [P, L] float32, targets [P] (the token itself at each target) and target_weights [P] float32
    (0 on padding rows); it drops `is_masked`. Keys as the model reads them: input_ids,
    segment_ids, input_mask (1 = real token: all ones), perm_mask, target_mapping, targets,
    target_weights, carry_reset [lanes, steps] int32 (1 on every lane's first step of the pass).
    """

    contiguous = True
    per_batch = True

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """The rows must fit their parts (`permutation.Settings`, keys defaulted as `__init__`
        defaults them)."""
        o = permutation.Settings.from_config(config.data)
        rest = o.seq_len - o.reuse_len
        if o.reuse_len >= o.seq_len - 3:
            raise validation.refuse("data.reuse_len", o.reuse_len, f"leaves no room for A <sep> B <sep> <cls> in "
                                    f"data.max_seq_length={o.seq_len}",
                                    f"use reuse_len < {o.seq_len - 3} (the reference: half the row)")
        if o.reuse_len % o.perm_size or rest % o.perm_size:
            raise validation.refuse("data.perm_size", o.perm_size, f"does not divide both data.reuse_len="
                                    f"{o.reuse_len} and the {rest} tokens after it",
                                    "use a common divisor of the two (the reference: reuse_len)")
        if o.predict_in_reuse > o.reuse_len or o.num_predict - o.predict_in_reuse > rest:
            raise validation.refuse("data.num_predict", o.num_predict, f"does not fit: half of it is predicted in "
                                    f"the {o.reuse_len} reused tokens and half in the {rest} after them",
                                    f"use at most {2 * min(o.reuse_len, rest)} (the reference: seq_len / 6)")
        if o.mask_alpha < o.mask_beta:
            raise validation.refuse("data.mask_alpha", o.mask_alpha, f"is below data.mask_beta={o.mask_beta}",
                                    "use mask_alpha >= mask_beta (the reference: 6 and 1)")
        for key in ("batch_size", "eval_batch_size"):
            value = validation.get(config, key)
            if o.bi_data and value is not validation.MISSING and value % 2:
                raise validation.refuse(key, value, "is odd and data.bi_data puts reversed copies of the lanes in "
                                        "half the batch", "use an even batch size or set data.bi_data=False")

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        self.settings = permutation.Settings.from_config(cfg)
        self.word_starts = np.asarray(tokenizer.word_starts(np.arange(tokenizer.vocab_size)), bool)
        self.functional = np.array([tokenizer.sep_id, tokenizer.cls_id])

    def _stream(self, documents: Sequence[Document]) -> tuple[np.ndarray, np.ndarray]:
        """The corpus as one token stream and its alternating sentence ids."""
        tokens: list[np.ndarray] = []
        ids: list[np.ndarray] = []
        for doc in documents:
            sentences = [np.asarray(s, np.int64) for s in doc if len(s)]
            if sentences:
                sentences[-1] = np.append(sentences[-1], self.tokenizer.eos_id)
            for s in sentences:
                ids.append(np.full(len(s), len(tokens) % 2, np.int8))
                tokens.append(s)
        if not tokens:
            return np.zeros(0, np.int64), np.zeros(0, np.int8)
        return np.concatenate(tokens), np.concatenate(ids)

    def _targets(self, segment: np.ndarray, count: int, reverse: bool, rng: np.random.Generator) -> np.ndarray:
        starts = self.word_starts[segment]
        chosen = permutation.span_targets(starts[::-1] if reverse else starts, rng, num_predict=count,
                                          alpha=self.settings.mask_alpha, beta=self.settings.mask_beta)
        return chosen[::-1] if reverse else chosen

    # A contiguous transform's pass takes the lane count (`Transform`), so it overrides with one argument more.
    def instances(self, documents: Sequence[Document], rng: np.random.Generator, lanes: int) -> Batch:  # type: ignore[override]
        o = self.settings
        if o.bi_data and lanes % 2:
            raise UserError(f"data.bi_data puts reversed copies in half the batch; batch_size={lanes} is odd: "
                            "use an even batch_size or set data.bi_data=False")
        length, reuse, tok = o.seq_len, o.reuse_len, self.tokenizer
        stream, sent = self._stream(documents)
        forward = lanes // 2 if o.bi_data else lanes
        per_lane = len(stream) // forward
        data = stream[: forward * per_lane].reshape(forward, per_lane)
        sent = sent[: forward * per_lane].reshape(forward, per_lane)
        if o.bi_data:
            data, sent = np.concatenate([data, data[:, ::-1]]), np.concatenate([sent, sent[:, ::-1]])
        tail = np.array([tok.sep_id, tok.cls_id])
        steps: list[tuple[np.ndarray, ...]] = []  # (ids, segments, is_masked) per step
        start = 0
        while start + length <= per_lane:
            rows = []
            for b in range(lanes):
                split = permutation.split_a_and_b(data[b], sent[b], start + reuse, length - reuse - 3, rng)
                if split is None:
                    break
                a, bb, _ = split
                reverse = o.bi_data and b >= forward
                rest = np.concatenate([a, tail[:1], bb, tail])
                masked = np.concatenate([self._targets(data[b, start:start + reuse], o.predict_in_reuse, reverse, rng),
                                         self._targets(rest, o.num_predict - o.predict_in_reuse, reverse, rng)])
                segments = np.concatenate([np.zeros(reuse + len(a) + 1), np.ones(len(bb) + 1), [2]])
                rows.append((np.concatenate([data[b, start:start + reuse], rest]), segments, masked))
            if len(rows) < lanes:
                break
            steps.append(tuple(np.stack(r) for r in zip(*rows)))
            start += reuse
        if not steps:
            raise UserError(f"the corpus gives each of the {forward} lanes {per_lane} tokens, too few for one "
                            f"{length}-token step; give it more text, a smaller batch_size or data.max_seq_length")
        ids, segments, masked = (np.stack(x, axis=1) for x in zip(*steps))
        reset = np.zeros(ids.shape[:2], np.int32)
        reset[:, 0] = 1
        return {"input_ids": ids.astype(np.int32), "segment_ids": segments.astype(np.int32),
                "input_mask": np.ones_like(ids, np.int32), "is_masked": masked.astype(np.int8),
                "carry_reset": reset}

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        ids = batch["input_ids"]
        lead, length = ids.shape[:-1], ids.shape[-1]
        flat = ids.reshape(-1, length)
        masked = batch["is_masked"].reshape(-1, length).astype(bool)
        functional = np.isin(flat, self.functional)
        perm, mapping, targets, weights = [], [], [], []
        for row, m, f in zip(flat, masked, functional):
            mask, is_target = permutation.row_perm_mask(m, f, self.settings.reuse_len, self.settings.perm_size, rng)
            onehot, positions, w = permutation.target_mapping(is_target, self.settings.num_predict)
            perm.append(mask)
            mapping.append(onehot)
            targets.append(np.where(w > 0, row[positions], 0))
            weights.append(w)
        out = {k: v for k, v in batch.items() if k != "is_masked"}
        p = self.settings.num_predict
        out.update(perm_mask=np.stack(perm).reshape(*lead, length, length),
                   target_mapping=np.stack(mapping).reshape(*lead, p, length),
                   targets=np.stack(targets).astype(np.int32).reshape(*lead, p),
                   target_weights=np.stack(weights).reshape(*lead, p))
        return out
