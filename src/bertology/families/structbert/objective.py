"""StructBERT's objective: masked LM, the word structural objective (the original token at each
position of a shuffled trigram, through the same MLM head) and the three-way sentence structural
objective, summed with equal weight (Wang et al. 2020)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives import Terms
from bertology.objectives.bert import apply, mlm_means, nsp_means


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    ids, weights, shuffled = batch["masked_ids"], batch["masked_weights"], batch["shuffled"]
    means = {**mlm_means(out["mlm_logits"], ids, weights * (1 - shuffled)),
             **mlm_means(out["mlm_logits"], ids, weights * shuffled, name="wso"),
             **nsp_means(out["sso_logits"], batch["sentence_label"], name="sso")}
    return Terms(loss={"mlm_loss": 1.0, "wso_loss": 1.0, "sso_loss": 1.0}, means=means)
