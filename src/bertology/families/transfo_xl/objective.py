"""Language modelling with carried memory (Transformer-XL; XLNet's objective is the same loss).

The model reads the memory from `batch["carry"]` and returns the next one; the loss is the
cross-entropy of `logits` against `targets` where `target_weights` > 0: every next token for
Transformer-XL ([B, L]), the P permutation targets for XLNet ([B, P], the reference's
`two_stream_loss`, averaged over real targets). The memory goes back as `Terms.carry`, gradient
stopped by the model, so the next batch of the same rows continues from it. Perplexity is exp of
the mean loss over all batches.
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
    out = apply(model, params, batch, rng)
    means = mlm_means(out["logits"], batch["targets"], batch["target_weights"], name="lm")
    return Terms(loss={"lm_loss": 1.0}, means=means, carry=out["carry"])
