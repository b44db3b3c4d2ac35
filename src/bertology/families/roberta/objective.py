"""RoBERTa's objective: masked LM alone (no next-sentence prediction)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives import Terms
from bertology.objectives.bert import apply, mlm_means


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    return Terms(loss={"mlm_loss": 1.0}, means=mlm_means(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"]))
