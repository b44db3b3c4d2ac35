"""Skip-Thought's objective (Kiros et al. 2015, eq. 3): the log-likelihood of the next sentence
plus that of the previous one given the encoded sentence, as two mean token cross-entropies."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.families.skip_thought.model import NEIGHBOURS
from bertology.objectives import Mean, Terms, token_nll
from bertology.objectives.bert import apply


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    means = {}
    for side in NEIGHBOURS:
        nll, correct = token_nll(out[f"{side}_logits"], batch[f"{side}_ids"])
        means[f"{side}_loss"] = Mean.of(nll, batch[f"{side}_mask"])
        means[f"{side}_accuracy"] = Mean.of(correct, batch[f"{side}_mask"])
    return Terms(loss={f"{side}_loss": 1.0 for side in NEIGHBOURS}, means=means)
