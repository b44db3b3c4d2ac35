"""Causal language modelling (GPT): next-token cross-entropy at every position that has a target.

The data (`data.objective=causal`) gives each position its `targets` (the next token of the same
document piece) and `target_weights` (0 at each piece's last token and at padding), so the loss
is the mean over the weighted positions. Next-token accuracy is logged with it, and perplexity is
derived after aggregation: exp of the mean loss over all batches, never a mean of exps.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.objectives import Terms
from bertology.objectives.bert import apply, mlm_means

DERIVED = {"perplexity": lambda m: jnp.exp(m["lm_loss"])}


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    logits = apply(model, params, batch, rng)["logits"]
    return Terms(loss={"lm_loss": 1.0}, means=mlm_means(logits, batch["targets"], batch["target_weights"], name="lm"))
