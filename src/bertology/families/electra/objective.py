"""ELECTRA's objective: generator MLM + λ · replaced-token detection, and the paper's ablations.

The generator's logits at the masked positions are sampled (Gumbel-max) under stop_gradient, so
the discriminator loss cannot reach the generator through the sampled tokens; a sample equal to
the original token counts as original. Variants (`variant`):
  electra         discriminator loss over every real token (the paper's default)
  electra_15      discriminator loss over the masked positions only ("ELECTRA 15%")
  replace_mlm     the second network is an MLM predicting the originals at the masked positions,
                  which hold generator samples instead of [MASK] ("Replace MLM")
  all_tokens_mlm  as replace_mlm, but predicting every real token ("All-Tokens MLM", without the
                  paper's copy mechanism)
The two MLM variants need `model.discriminator_head='mlm'`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.errors import UserError
from bertology.objectives import Mean, Terms, divided
from bertology.objectives.bert import Metrics, apply, mlm_means

Array = jax.Array
VARIANTS = ("electra", "electra_15", "replace_mlm", "all_tokens_mlm")


def replace_with_samples(batch: dict[str, Array], gen_logits: Array, key: Array) -> tuple[Array, Array, Array]:
    """(corrupted ids, original ids, replaced mask): masked slots get a Gumbel-max sample of the
    generator; `replaced` is True only where the sample differs from the original token."""
    ids = jnp.asarray(batch["input_ids"])
    rows = jnp.arange(ids.shape[0])[:, None]
    positions, weights = batch["masked_positions"], batch["masked_weights"] > 0
    original = ids.at[rows, positions].set(jnp.where(weights, batch["masked_ids"], ids[rows, positions]))
    logits = jax.lax.stop_gradient(gen_logits).astype(jnp.float32)
    sampled = jnp.argmax(logits + jax.random.gumbel(key, logits.shape), axis=-1).astype(original.dtype)
    corrupted = original.at[rows, positions].set(jnp.where(weights, sampled, original[rows, positions]))
    return corrupted, original, corrupted != original


def rtd_means(logits: Array, replaced: Array, weights: Array) -> dict[str, Mean]:
    """Weighted sigmoid cross-entropy of 'replaced' per token, its accuracy and the replaced
    fraction, each divided by sum(w) + 1e-5."""
    nll = optax.sigmoid_binary_cross_entropy(logits, replaced.astype(jnp.float32))
    return {"disc_loss": Mean.of(nll, weights, eps=1e-5), "disc_accuracy": Mean.of((logits > 0) == replaced, weights, eps=1e-5),
            "replaced_fraction": Mean.of(replaced, weights, eps=1e-5)}


def rtd_loss(logits: Array, replaced: Array, weights: Array) -> tuple[Array, Metrics]:
    """One batch's discriminator loss and metrics (`rtd_means` divided)."""
    m = divided(rtd_means(logits, replaced, weights))
    return m["disc_loss"], m


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: nn.Module, *,
         disc_weight: float = 50.0, variant: str = "electra") -> Terms:
    """L_MLM(generator) + disc_weight · L_disc. `rng=None` (evaluation) samples with a fixed key."""
    if variant not in VARIANTS:
        raise UserError(f"objective.variant={variant!r} is unknown; use one of {VARIANTS}")
    keys = jax.random.split(jax.random.key(0) if rng is None else rng, 3)
    gen_rng, disc_rng = (None, None) if rng is None else (keys[1], keys[2])
    gen_logits = apply(model, params, batch, gen_rng, method="generate")
    corrupted, original, replaced = replace_with_samples(batch, gen_logits, keys[0])
    corrupted_batch = {**batch, "input_ids": corrupted}
    if variant in ("electra", "electra_15"):
        logits = apply(model, params, corrupted_batch, disc_rng, method="discriminate")
        if variant == "electra":
            weights = batch["input_mask"]
        else:
            rows = jnp.arange(replaced.shape[0])[:, None]
            weights = jnp.zeros(replaced.shape, jnp.float32).at[rows, batch["masked_positions"]].max(
                batch["masked_weights"])
        disc = rtd_means(logits, replaced, weights)
    else:
        if variant == "replace_mlm":
            positions, targets, weights = batch["masked_positions"], batch["masked_ids"], batch["masked_weights"]
        else:
            length = original.shape[1]
            positions = jnp.broadcast_to(jnp.arange(length), original.shape)
            targets, weights = original, batch["input_mask"]
        logits = apply(model, params, corrupted_batch, disc_rng, method="discriminate", positions=positions)
        disc = {**mlm_means(logits, targets, weights, name="disc"),
                "replaced_fraction": Mean.of(replaced, batch["input_mask"])}
    means = {**mlm_means(gen_logits, batch["masked_ids"], batch["masked_weights"]), **disc}
    return Terms(loss={"mlm_loss": 1.0, "disc_loss": disc_weight}, means=means)
