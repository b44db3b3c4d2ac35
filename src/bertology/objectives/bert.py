"""BERT's pretraining losses: masked LM over the gathered positions plus next-sentence prediction.

`mlm_loss` and `nsp_loss` are plain functions of logits and labels, so other families reuse them
(RoBERTa uses MLM alone; ALBERT feeds sentence-order labels through the same classifier loss).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Array = jax.Array
Metrics = dict[str, Array]


def mlm_loss(logits: Array, masked_ids: Array, masked_weights: Array) -> tuple[Array, Metrics]:
    """Weighted mean cross-entropy over predicted positions, as in BERT:
    sum(w · nll) / (sum(w) + 1e-5); padded prediction slots carry weight 0.

    Accuracy compares the label's logit with the row's maximum (which the log-sum-exp computes
    anyway) instead of running an argmax, a second pass over the [.., vocab] logits that cost 6%
    of a BERT-mini step on CPU; an exact tie counts as correct.
    """
    logits = logits.astype(jnp.float32)
    label_logit = jnp.take_along_axis(logits, masked_ids[..., None], axis=-1)[..., 0]
    nll = jax.nn.logsumexp(logits, axis=-1) - label_logit
    w = masked_weights.astype(jnp.float32)
    denom = jnp.sum(w) + 1e-5
    loss = jnp.sum(nll * w) / denom
    correct = (label_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
    return loss, {"mlm_loss": loss, "mlm_accuracy": jnp.sum(correct * w) / denom}


def nsp_loss(logits: Array, labels: Array, name: str = "nsp") -> tuple[Array, Metrics]:
    """Mean two-way cross-entropy of a sentence-pair classifier (label 1 = random next)."""
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels))
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
    return loss, {f"{name}_loss": loss, f"{name}_accuracy": acc}


def apply(model: nn.Module, params: Any, batch: dict[str, Array], rng: Array | None, method: str | None = None,
          **kwargs: Any) -> Any:
    """Run `model` (or one of its methods, with `kwargs`) with dropout driven by `rng`; None means evaluation."""
    return model.apply(
        {"params": params},
        batch,
        deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng},
        method=method,
        **kwargs,
    )


def loss(
    params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module
) -> tuple[Array, Metrics]:
    """MLM + NSP. `rng` drives dropout; None means evaluation (dropout off)."""
    out = apply(model, params, batch, rng)
    mlm, metrics = mlm_loss(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
    nsp, nsp_metrics = nsp_loss(out["nsp_logits"], batch["next_sentence_label"])
    total = mlm + nsp
    return total, {"loss": total, **metrics, **nsp_metrics}
