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

from bertology.models.transformer import TransformerConfig, dense, init, layer_norm, zeros

Array = jax.Array


@jax.custom_vjp
def add_vocab_bias(logits: Array, bias: Array) -> Array:
    """`logits + bias` over the vocabulary axis, with the bias gradient taken as a matrix product on CPU.

    That gradient is the column sum of the [rows, vocab] logit gradient. XLA:CPU lowers the
    reduction over rows about 25x slower than the same sum written as ones[rows] @ grad (63 ms
    against 2.4 ms for 640 x 30522 on 2 cores): 5% of a BERT-mini step. GPUs and TPUs reduce
    fast and would run that product as a full-precision float32 matmul, so there it is a sum.
    """
    return logits + bias


def _add_vocab_bias_fwd(logits: Array, bias: Array) -> tuple[Array, None]:
    return logits + bias, None


def _add_vocab_bias_bwd(_: None, g: Array) -> tuple[Array, Array]:
    rows = g.reshape(-1, g.shape[-1])
    if jax.default_backend() != "cpu":
        return g, jnp.sum(rows, axis=0)
    # HIGHEST: an exact float32 sum (the default matmul precision of other backends is lower).
    return g, jnp.matmul(jnp.ones((rows.shape[0],), g.dtype), rows, precision=jax.lax.Precision.HIGHEST)


add_vocab_bias.defvjp(_add_vocab_bias_fwd, _add_vocab_bias_bwd)


class MaskedLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then logits against the (tied) token embedding table + a bias.

    `attend` is the embedding table's tied projection, passed in so the head owns no copy of it.
    The transform maps H to the embedding width E (ALBERT/ELECTRA factorize E < H).
    """

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, hidden: Array, attend: Callable[[Array], Array]) -> Array:
        cfg = self.cfg
        x = dense(cfg, cfg.embed_dim, ("hidden", "embed"), "transform")(hidden)
        x = layer_norm(cfg, "norm")(cfg.act(x))
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,), jnp.float32)
        return cfg.real_logits(add_vocab_bias(attend(x).astype(jnp.float32), bias))


class ClassifierHead(nn.Module):
    """A linear classifier over a pooled vector (NSP and SOP use two classes)."""

    cfg: TransformerConfig
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

    cfg: TransformerConfig
    max_span_positions: int = 200

    @staticmethod
    def boundaries(span_start: Array, span_end: Array, length: int) -> tuple[Array, Array]:
        """The positions whose states the head reads: the token before each span and the one after
        it (`span_end` is exclusive), clipped to the row."""
        return jnp.maximum(span_start - 1, 0), jnp.minimum(span_end, length - 1)

    @nn.compact
    def __call__(self, left: Array, right: Array, positions: Array, span_start: Array,
                 attend: Callable[[Array], Array]) -> Array:
        """`left`/`right`: [batch, n, H] encoder states at `boundaries(...)` of each prediction's span."""
        cfg = self.cfg
        offset = jnp.clip(positions - span_start, 0, self.max_span_positions - 1)
        pos = nn.Embed(self.max_span_positions, cfg.hidden_size, dtype=cfg.compute_dtype,
                       embedding_init=init(cfg, (None, "embed")), name="position")(offset)
        h = jnp.concatenate([left, right, pos.astype(left.dtype)], axis=-1)
        for i in range(2):
            h = dense(cfg, cfg.hidden_size if i == 0 else cfg.embed_dim, ("hidden", "embed"), f"dense_{i}")(h)
            h = layer_norm(cfg, f"norm_{i}")(cfg.act(h))
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,), jnp.float32)
        return cfg.real_logits(add_vocab_bias(attend(h).astype(jnp.float32), bias))
