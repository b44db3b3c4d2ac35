"""Quick-Thought's objective: each sentence's neighbours (the sentence before and the one after, in
its row) classified among every other sentence of the batch by f(s)·g(c), the log-probabilities
of the true neighbours averaged (Logeswaran & Lee 2018, eq. 1)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply


def neighbour_scores(sentence: jax.Array, context: jax.Array, real: jax.Array,
                     per_row: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log-probabilities [n, n] of each candidate for each sentence, over the real candidates but
    itself; the neighbour mask [n, n]; each sentence's top candidate is a neighbour [n]) for
    n = rows · per_row sentences in row order."""
    n = sentence.shape[0]
    scores = jnp.einsum("ih,jh->ij", sentence.astype(jnp.float32), context.astype(jnp.float32))
    index = jnp.arange(n)
    candidate = real[None, :] & (index[:, None] != index[None, :])
    floor = jnp.finfo(jnp.float32).min  # not -inf: a row with no candidate stays finite (and carries no weight)
    logp = jax.nn.log_softmax(jnp.where(candidate, scores, floor), axis=-1)
    same_row = (index[:, None] // per_row) == (index[None, :] // per_row)
    neighbour = same_row & (jnp.abs(index[:, None] - index[None, :]) == 1) & real[:, None] & real[None, :]
    best = jnp.argmax(jnp.where(candidate, scores, floor), axis=-1)
    return logp, neighbour, jnp.take_along_axis(neighbour, best[:, None], axis=1)[:, 0]


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    logp, neighbour, hit = neighbour_scores(out["sentence"], out["context"], out["real"], batch["input_ids"].shape[1])
    has = neighbour.any(-1)
    nll = -jnp.sum(jnp.where(neighbour, logp, 0.0), axis=-1) / jnp.maximum(neighbour.sum(-1), 1)
    return Terms(loss={"qt_loss": 1.0}, means={"qt_loss": Mean.of(nll, has), "qt_accuracy": Mean.of(hit, has)})
