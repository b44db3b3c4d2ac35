"""RoBERTa's objective: masked LM alone (no next-sentence prediction)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives.bert import Metrics, apply, mlm_loss


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> tuple[jax.Array, Metrics]:
    out = apply(model, params, batch, rng)
    mlm, metrics = mlm_loss(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
    return mlm, {"loss": mlm, **metrics}
