"""BERT's pretraining losses: masked LM over the gathered positions plus next-sentence prediction.

`mlm_means` and `nsp_means` are plain functions of logits and labels returning undivided means
(see `bertology.objectives`), so other families reuse them (RoBERTa uses MLM alone; ALBERT feeds
sentence-order labels through the same classifier loss; SpanBERT and ELECTRA name theirs).
`mlm_loss` and `nsp_loss` give one batch's divided values, for code outside the train loop.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.objectives import Mean, Terms, divided, token_means, token_nll

Array = jax.Array
Metrics = dict[str, Array]


def mlm_means(logits: Array, masked_ids: Array, masked_weights: Array, name: str = "mlm") -> dict[str, Mean]:
    """Weighted cross-entropy and accuracy of token predictions ([.., vocab] logits: MLM at the
    masked slots, or any other), as `{name}_loss`, `{name}_accuracy` (`token_nll`, `token_means`)."""
    return token_means(*token_nll(logits, masked_ids), masked_weights, name)


def nsp_means(logits: Array, labels: Array, name: str = "nsp") -> dict[str, Mean]:
    """Mean two-way cross-entropy and accuracy of a sentence-pair classifier (label 1 = random next)."""
    nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return {f"{name}_loss": Mean.of(nll), f"{name}_accuracy": Mean.of(jnp.argmax(logits, axis=-1) == labels)}


def mlm_loss(logits: Array, masked_ids: Array, masked_weights: Array) -> tuple[Array, Metrics]:
    """One batch's MLM loss and metrics (`mlm_means` divided)."""
    m = divided(mlm_means(logits, masked_ids, masked_weights))
    return m["mlm_loss"], m


def nsp_loss(logits: Array, labels: Array, name: str = "nsp") -> tuple[Array, Metrics]:
    """One batch's sentence-pair loss and metrics (`nsp_means` divided)."""
    m = divided(nsp_means(logits, labels, name))
    return m[f"{name}_loss"], m


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


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module) -> Terms:
    """MLM + NSP. `rng` drives dropout; None means evaluation (dropout off)."""
    out = apply(model, params, batch, rng)
    means = {**mlm_means(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
             **nsp_means(out["nsp_logits"], batch["next_sentence_label"])}
    return Terms(loss={"mlm_loss": 1.0, "nsp_loss": 1.0}, means=means)
