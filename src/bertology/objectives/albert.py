"""ALBERT's objective: masked LM plus sentence-order prediction (label 1 = the two consecutive
segments were swapped). SOP uses the same two-way classifier loss as NSP."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bertology.objectives.bert import Metrics, apply, mlm_loss, nsp_loss


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> tuple[jax.Array, Metrics]:
    out = apply(model, params, batch, rng)
    mlm, metrics = mlm_loss(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
    sop, sop_metrics = nsp_loss(out["sop_logits"], batch["next_sentence_label"], name="sop")
    total = mlm + sop
    return total, {"loss": total, **metrics, **sop_metrics}
