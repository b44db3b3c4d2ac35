"""Sequence-to-sequence denoising (BART, T5, MASS): token cross-entropy of the decoder's
teacher-forced predictions over `targets`, weighted by `target_weights` (0 at padding).

The data transforms (`data.objective`: span_corruption, bart, mass) give the batch its source
(`input_ids`, `input_mask`), the decoder input (`decoder_input_ids`, `decoder_input_mask`: the
targets shifted right with the family's start id) and the targets; the model returns logits at
every target position. The loss and accuracy are the weighted means over target tokens (as sums,
so gradient accumulation is exact; see `bertology.objectives`), and perplexity is exp of the mean
loss after aggregation.

`label_smoothing` ε (Szegedy et al. 2016, the seq2seq fine-tuning default 0.1) trains on the
target distribution (1 - ε)·one-hot + ε·uniform over the vocabulary, that is
(1 - ε)·NLL + ε·mean over the vocabulary of -log p; the loss term is then `smoothed_loss`, and
`lm_loss` (the plain NLL, from which perplexity is derived) is still logged.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply, mlm_means

DERIVED = {"perplexity": lambda m: jnp.exp(m["lm_loss"])}


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module, *,
         label_smoothing: float = 0.0) -> Terms:
    if not 0.0 <= label_smoothing < 1.0:
        raise UserError(f"objective.label_smoothing={label_smoothing} must be in [0, 1); 0 turns it off")
    logits = apply(model, params, batch, rng)["logits"]
    means = mlm_means(logits, batch["targets"], batch["target_weights"], name="lm")
    if not label_smoothing:
        return Terms(loss={"lm_loss": 1.0}, means=means)
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = log_z - jnp.take_along_axis(logits, batch["targets"][..., None], axis=-1)[..., 0]
    uniform = log_z - jnp.mean(logits, axis=-1)  # mean over the vocabulary of -log p
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    means["smoothed_loss"] = Mean.of(smoothed, batch["target_weights"], eps=1e-5)
    return Terms(loss={"smoothed_loss": 1.0}, means=means)
