"""Fine-tuning losses, one per head kind, behind the loop's `loss(params, batch, rng, model)`.

Classification, token tagging and multiple choice use cross-entropy (token tagging only where
`labels` >= 0: first sub-words); regression (STS-B) uses mean squared error; extractive QA
averages the start and end cross-entropies, as the reference BERT does (one mean over the 2·rows
boundary predictions).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply

Array = jax.Array


def _cross_entropy(logits: Array, labels: Array, weights: Array | None = None) -> tuple[Array, Array, Array]:
    """(per-position losses, per-position correctness, weights): positions with weight 0 (label < 0) are ignored."""
    w = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
    safe = jnp.maximum(labels, 0)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
    return nll, jnp.argmax(logits, axis=-1) == safe, w


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module) -> Terms:
    """The loss of `model.kind`; `rng` drives dropout, None means evaluation."""
    out = apply(model, params, batch, rng)
    kind = model.kind
    if kind == "regression":
        return Terms(loss={"mse": 1.0}, means={"mse": Mean.of(jnp.square(out["logits"] - batch["label"]))})
    if kind == "qa":
        parts = [_cross_entropy(out[f"{end}_logits"], batch[f"{end}_position"]) for end in ("start", "end")]
        nll, correct, w = (jnp.stack(x) for x in zip(*parts))
    elif kind == "token":
        nll, correct, w = _cross_entropy(out["logits"], batch["labels"], batch["labels"] >= 0)
    else:
        nll, correct, w = _cross_entropy(out["logits"], batch["label"])
    return Terms(loss={"cross_entropy": 1.0}, means={"cross_entropy": Mean.of(nll, w), "accuracy": Mean.of(correct, w)})
