"""The fine-tuning loss behind the loop's `loss(params, batch, rng, model)`: the task kind's own
(`bertology.tasks.kinds`): cross-entropy for classification, token tagging (first sub-words only)
and multiple choice, the squared error for regression (STS-B), the mean of the start and end
cross-entropies for extractive QA. `lm_weight` λ adds GPT's auxiliary language-modelling loss,
L = L_task + λ·L_LM, L_LM the mean over rows of each row's mean next-token cross-entropy
(Radford et al. 2018, §3.2: λ = 0.5; openai/finetune-transformer-lm's `train.py`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply
from bertology.tasks import kinds

Array = jax.Array


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module, *,
         lm_weight: float = 0.0) -> Terms:
    """The loss of `model.kind` (+ λ·LM with `lm_weight`); `rng` drives dropout, None means evaluation."""
    out = apply(model, params, batch, rng, language_model=lm_weight > 0)
    terms = kinds.of(model.kind).loss(out, batch)
    if not lm_weight:
        return terms
    # as the reference (openai/finetune-transformer-lm): each row's mean over its real next tokens, then the rows' mean
    w = out["lm_weights"].astype(jnp.float32)
    per_row = jnp.sum(out["lm_nll"] * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)
    return Terms({**terms.loss, "lm": lm_weight}, {**terms.means, "lm": Mean.of(per_row, jnp.sum(w, axis=1) > 0)})
