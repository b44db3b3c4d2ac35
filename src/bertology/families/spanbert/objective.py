"""SpanBERT's objective: masked LM plus the span boundary objective, both over the masked slots,
summed with equal weight as in the paper."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives import Terms
from bertology.objectives.bert import apply, mlm_means


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    ids, weights = batch["masked_ids"], batch["masked_weights"]
    means = {**mlm_means(out["mlm_logits"], ids, weights), **mlm_means(out["sbo_logits"], ids, weights, name="sbo")}
    return Terms(loss={"mlm_loss": 1.0, "sbo_loss": 1.0}, means=means)
