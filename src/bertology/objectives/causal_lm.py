"""Causal language modelling (GPT): next-token cross-entropy at every position that has a target.

The data (`data.objective=causal`) gives each position its `targets` (the next token of the same
document piece) and `target_weights` (0 at each piece's last token and at padding), so the loss
is the mean over the weighted positions. Next-token accuracy is logged with it, and perplexity is
derived after aggregation: exp of the mean loss over all batches, never a mean of exps.

A model with an `output_layer` method (GPT's: final states and tied table) gets its loss from
`chunked_token_nll`, `chunk_tokens` tokens of logits at a time, so the [tokens, vocab] float32
logits of a whole batch (GPT-2's 50257 columns: 200 kB a token) never exist at once; a batch of
at most `chunk_tokens` tokens (the tiny preset's 32 x 128) is one chunk, the unchunked numbers.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.objectives import Terms, chunked_token_nll, token_means
from bertology.objectives.bert import apply, mlm_means

DERIVED = {"perplexity": lambda m: jnp.exp(m["lm_loss"])}


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module, *,
         chunk_tokens: int = 4096) -> Terms:
    targets, weights = batch["targets"], batch["target_weights"]
    if not hasattr(model, "output_layer"):
        logits = apply(model, params, batch, rng)["logits"]
        return Terms(loss={"lm_loss": 1.0}, means=mlm_means(logits, targets, weights, name="lm"))
    if chunk_tokens < 1:
        raise UserError(f"objective.chunk_tokens={chunk_tokens}: the loss computes that many tokens' logits at a "
                        "time; use a positive number such as 4096")
    out = apply(model, params, batch, rng, method="output_layer")
    nll, correct = chunked_token_nll(out["states"], out["table"], targets, model.cfg, chunk_tokens)
    return Terms(loss={"lm_loss": 1.0}, means=token_means(nll, correct, weights, name="lm"))
