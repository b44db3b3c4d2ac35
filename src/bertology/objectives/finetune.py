"""Fine-tuning losses, one per head kind, behind the loop's `loss(params, batch, rng, model)`.

Classification, token tagging and multiple choice use cross-entropy (token tagging only where
`labels` >= 0: first sub-words); regression (STS-B) uses mean squared error; extractive QA
averages the start and end cross-entropies, as the reference BERT does.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.objectives.bert import apply

Array = jax.Array


def _cross_entropy(logits: Array, labels: Array, weights: Array | None = None) -> tuple[Array, Array]:
    """(mean loss, accuracy) over positions with weight 1 (all when weights is None)."""
    w = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
    safe = jnp.maximum(labels, 0)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
    denom = jnp.maximum(jnp.sum(w), 1.0)
    correct = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32)
    return jnp.sum(nll * w) / denom, jnp.sum(correct * w) / denom


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module) -> tuple[Array, dict[str, Array]]:
    """The loss of `model.kind`; `rng` drives dropout, None means evaluation."""
    out = apply(model, params, batch, rng)
    kind = model.kind
    if kind == "regression":
        value = jnp.mean(jnp.square(out["logits"] - batch["label"]))
        return value, {"loss": value}
    if kind == "qa":
        start, start_acc = _cross_entropy(out["start_logits"], batch["start_position"])
        end, end_acc = _cross_entropy(out["end_logits"], batch["end_position"])
        value = (start + end) / 2
        return value, {"loss": value, "accuracy": (start_acc + end_acc) / 2}
    if kind == "token":
        value, acc = _cross_entropy(out["logits"], batch["labels"], batch["labels"] >= 0)
    else:
        value, acc = _cross_entropy(out["logits"], batch["label"])
    return value, {"loss": value, "accuracy": acc}
