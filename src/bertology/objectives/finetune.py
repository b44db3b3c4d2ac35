"""The fine-tuning loss behind the loop's `loss(params, batch, rng, model)`: the task kind's own
(`bertology.tasks.kinds`): cross-entropy for classification, token tagging (first sub-words only)
and multiple choice, the squared error for regression (STS-B), the mean of the start and end
cross-entropies for extractive QA. `lm_weight` λ adds GPT's auxiliary language-modelling loss,
L = L_task + λ·L_LM over the rows' real next tokens (Radford et al. 2018, §3.2: λ = 0.5).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

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
    return Terms({**terms.loss, "lm": lm_weight}, {**terms.means, "lm": Mean.of(out["lm_nll"], out["lm_weights"])})
