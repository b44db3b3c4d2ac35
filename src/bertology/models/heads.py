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

from bertology.models.encoder import EncoderConfig, dense, init, layer_norm, zeros

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
        x = layer_norm(cfg, "norm")(cfg.act(x))
        bias = self.param("bias", zeros(("vocab",)), (cfg.vocab_size,), jnp.float32)
        return attend(x).astype(jnp.float32) + bias


class ClassifierHead(nn.Module):
    """A linear classifier over a pooled vector (NSP and SOP use two classes)."""

    cfg: EncoderConfig
    num_classes: int = 2

    @nn.compact
    def __call__(self, pooled: Array) -> Array:
        return dense(self.cfg, self.num_classes, ("hidden", None), "dense")(pooled).astype(jnp.float32)


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective: predict each masked token from the encoder outputs
    just outside its span plus an embedding of its position inside the span.

    [x_{start-1}; x_{end}; p_{i-start}] -> Dense+GELU+LayerNorm -> Dense+GELU+LayerNorm -> tied
    vocabulary logits with their own bias. `max_span_positions` is the size of the position table
    (the reference uses 200; spans are at most 10 words, so a few dozen suffice for sub-words).
    """

    cfg: EncoderConfig
    max_span_positions: int = 200

    @nn.compact
    def __call__(self, sequence: Array, positions: Array, span_start: Array, span_end: Array,
                 attend: Callable[[Array], Array]) -> Array:
        cfg = self.cfg
        left = gather_positions(sequence, jnp.maximum(span_start - 1, 0))
        right = gather_positions(sequence, jnp.minimum(span_end, sequence.shape[1] - 1))
        offset = jnp.clip(positions - span_start, 0, self.max_span_positions - 1)
        pos = nn.Embed(self.max_span_positions, cfg.hidden_size, dtype=cfg.compute_dtype,
                       embedding_init=init(cfg, (None, "embed")), name="position")(offset)
        h = jnp.concatenate([left, right, pos.astype(left.dtype)], axis=-1)
        for i in range(2):
            h = dense(cfg, cfg.hidden_size if i == 0 else cfg.embed_dim, ("hidden", "embed"), f"dense_{i}")(h)
            h = layer_norm(cfg, f"norm_{i}")(cfg.act(h))
        bias = self.param("bias", zeros(("vocab",)), (cfg.vocab_size,), jnp.float32)
        return attend(h).astype(jnp.float32) + bias
