"""The fine-tuning loss behind the loop's `loss(params, batch, rng, model)`: the task kind's own
(`bertology.tasks.kinds`): cross-entropy for classification, token tagging (first sub-words only)
and multiple choice, the squared error for regression (STS-B), the mean of the start and end
cross-entropies for extractive QA.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives import Terms
from bertology.objectives.bert import apply
from bertology.tasks import kinds

Array = jax.Array


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module) -> Terms:
    """The loss of `model.kind`; `rng` drives dropout, None means evaluation."""
    return kinds.of(model.kind).loss(apply(model, params, batch, rng), batch)
