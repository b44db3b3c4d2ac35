"""ELMo's biLM objective (Peters et al. 2018): a forward and a backward language model, each a full
softmax over the word vocabulary, averaged as bilm-tf's training loss is (0.5 · (forward +
backward)).

The data (`data.objective=bilm`) gives `targets`/`target_weights` (the next word of the stream)
and `backward_targets`/`backward_target_weights` (the next word of the backward stream: the
previous word of the sentence). The data is contiguous lanes, so the batch holds the LSTM states
of the segment before (`carry`) and the loss hands the final ones on (`Terms.carry`,
`families/elmo/model.py`). Perplexity is derived after aggregation from that averaged loss, as
the reference reports it; each direction's own perplexity is logged too.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.objectives import Terms
from bertology.objectives.bert import apply, mlm_means

DERIVED = {
    "perplexity": lambda m: jnp.exp(0.5 * (m["forward_loss"] + m["backward_loss"])),
    "forward_perplexity": lambda m: jnp.exp(m["forward_loss"]),
    "backward_perplexity": lambda m: jnp.exp(m["backward_loss"]),
}


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module) -> Terms:
    out = apply(model, params, batch, rng)
    means = {**mlm_means(out["forward_logits"], batch["targets"], batch["target_weights"], name="forward"),
             **mlm_means(out["backward_logits"], batch["backward_targets"], batch["backward_target_weights"],
                         name="backward")}
    return Terms(loss={"forward_loss": 0.5, "backward_loss": 0.5}, means=means, carry=out.get("carry"))
