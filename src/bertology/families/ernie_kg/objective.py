"""ERNIE's (Tsinghua) objective: BERT's masked LM and NSP plus the denoising entity auto-encoder,
summed with equal weight, as thunlp/ERNIE's `BertForPreTraining` adds `masked_lm_loss`,
`next_sentence_loss` and `ent_ae_loss` (Zhang et al. 2019, §4.3)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives import Mean, Terms, token_means, token_nll
from bertology.objectives.bert import apply, mlm_means, nsp_means


def dea_means(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> dict[str, Mean]:
    """`dea_loss` and `dea_accuracy`: the cross-entropy of each aligned token's entity among its
    row's candidates (`logits` [batch, length, candidates], masked ones -inf), over the aligned tokens."""
    return token_means(*token_nll(logits, labels), weights, "dea")


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    means = {**mlm_means(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
             **nsp_means(out["nsp_logits"], batch["next_sentence_label"]),
             **dea_means(out["dea_logits"], batch["entity_labels"], batch["entity_weights"])}
    return Terms(loss={"mlm_loss": 1.0, "nsp_loss": 1.0, "dea_loss": 1.0}, means=means)
