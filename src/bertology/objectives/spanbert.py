"""SpanBERT's objective: masked LM plus the span boundary objective, both over the masked slots,
summed with equal weight as in the paper."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives.bert import Metrics, apply, mlm_loss


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> tuple[jax.Array, Metrics]:
    out = apply(model, params, batch, rng)
    mlm, metrics = mlm_loss(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
    sbo, sbo_metrics = mlm_loss(out["sbo_logits"], batch["masked_ids"], batch["masked_weights"])
    total = mlm + sbo
    return total, {"loss": total, **metrics, "sbo_loss": sbo_metrics["mlm_loss"], "sbo_accuracy": sbo_metrics["mlm_accuracy"]}
