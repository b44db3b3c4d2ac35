"""ALBERT's objective: masked LM plus sentence-order prediction (label 1 = the two consecutive
segments were swapped). SOP uses the same two-way classifier loss as NSP."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives import Terms
from bertology.objectives.bert import apply, mlm_means, nsp_means


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    means = {**mlm_means(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
             **nsp_means(out["sop_logits"], batch["next_sentence_label"], name="sop")}
    return Terms(loss={"mlm_loss": 1.0, "sop_loss": 1.0}, means=means)
