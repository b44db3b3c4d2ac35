"""context2vec's objective: word2vec's negative sampling between a slot's context vector c and
target embeddings t, -log σ(c·t_word) - Σ_k log σ(-c·t_k) per word (the reference's chainer
`NegativeSampling`), averaged over the words; `c2v_accuracy` is how often the word outscores
all of its negatives."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.families.context2vec.model import words
from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    context, targets = out["context"].astype(jnp.float32), out["targets"].astype(jnp.float32)
    positive = jnp.einsum("bld,bld->bl", context, targets[batch["input_ids"]])
    negative = jnp.einsum("bld,blkd->blk", context, targets[batch["negatives"]])
    nll = jax.nn.softplus(-positive) + jnp.sum(jax.nn.softplus(negative), axis=-1)
    w = words(batch)
    return Terms(loss={"c2v_loss": 1.0}, means={"c2v_loss": Mean.of(nll, w),
                                                "c2v_accuracy": Mean.of(positive > negative.max(-1), w)})
