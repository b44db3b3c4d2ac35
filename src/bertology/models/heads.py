"""Heads kept apart from the trunk: each is a small module over encoder outputs.

The MLM head is evaluated only at the gathered masked positions (`max_predictions_per_seq` of
them), as the original BERT does: running the vocabulary projection at every position costs
~6·d·V FLOPs per token for nothing.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.models.encoder import EncoderConfig, dense, layer_norm, zeros

Array = jax.Array


def gather_positions(sequence: Array, positions: Array) -> Array:
    """[batch, length, d] gathered at [batch, n] positions -> [batch, n, d]."""
    return jnp.take_along_axis(sequence, positions[..., None], axis=1)


class MaskedLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then logits against the (tied) token embedding table + a bias.

    `attend` is the embedding table's tied projection, passed in so the head owns no copy of it.
    The transform maps H to the embedding width E (ALBERT/ELECTRA factorize E < H).
    """

    cfg: EncoderConfig

    @nn.compact
    def __call__(self, hidden: Array, attend: Callable[[Array], Array]) -> Array:
        cfg = self.cfg
        x = dense(cfg, cfg.embed_dim, ("hidden", "embed"), "transform")(hidden)
        x = layer_norm(cfg, "norm")(nn.gelu(x, approximate=False))
        bias = self.param("bias", zeros(("vocab",)), (cfg.vocab_size,), jnp.float32)
        return attend(x).astype(jnp.float32) + bias


class ClassifierHead(nn.Module):
    """A linear classifier over a pooled vector (NSP and SOP use two classes)."""

    cfg: EncoderConfig
    num_classes: int = 2

    @nn.compact
    def __call__(self, pooled: Array) -> Array:
        return dense(self.cfg, self.num_classes, ("hidden", None), "dense")(pooled).astype(jnp.float32)
