"""The one softmax attention every family runs through: `attend`.

Families differ in how they project queries, keys and values and in what they add to q·k (T5's
bucket bias, Transformer-XL's and XLNet's position, content-bias and segment terms), never in
the softmax attention itself. So that part lives here once, and a faster backend (a fused
kernel, a TPU splash kernel) replaces it in one place for every family.

The score-term hook is `bias`: a family's extra terms arrive as one additive [1|batch, heads,
queries, keys] array, already multiplied by whatever the family scales them with, so that the
softmax runs over `scale · q·k + bias`. Keeping the extra terms out of q·k lets a fused kernel
still do the big product, and an additive bias is what those kernels accept.

Without dropout on the probabilities the fused `jax.nn.dot_product_attention` runs; with it the
softmax is written out (the kernel has no dropout), a causal square in blocks of queries. The
dropout is the caller's own callable, so each family keeps its random stream: the core's hashed
`Dropout`, XL's and XLNet's flax `nn.Dropout`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def causal_blocks(length: int) -> int:
    """How many query blocks a causal square of `length` runs in (see `attend`): the most of
    8, 4, 2 that divide it into blocks of at least 128 queries (smaller blocks cost more in
    per-op overhead than the skipped scores save), else 1."""
    return next((b for b in (8, 4, 2) if length % b == 0 and length // b >= 128), 1)


def scores(q: Array, k: Array, bias: Array | None = None, scale: float | None = None) -> Array:
    """The pre-softmax scores [batch, heads, queries, keys] in float32, before any mask: what
    the explicit path normalises and what attention distillation (TinyBERT) compares.

    `scale` None divides q·k by sqrt(head width) in the compute dtype (the core's long-standing
    arithmetic, kept so that sown scores and training runs do not move); otherwise multiplies."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    if scale is None:
        s = s / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    elif scale != 1.0:
        s = s * jnp.asarray(scale, q.dtype)
    return s.astype(jnp.float32) + (0.0 if bias is None else bias.astype(jnp.float32))


def attend(q: Array, k: Array, v: Array, *, allowed: Array | None = None, is_causal: bool = False,
           bias: Array | None = None, scale: float | None = None,
           dropout: Callable[[Array], Array] | None = None) -> Array:
    """softmax(scale · q·k + bias, over the allowed keys) · v, in [batch, length, heads, head_dim].

    - `allowed`: boolean, broadcastable to [batch, heads, queries, keys]; `is_causal` further
      restricts query i to keys 0..i (a plain causal square, left to the kernel so it can skip
      blocks without a materialised mask);
    - `bias`: the family's additive score terms (see the module docstring), pre-scaled;
    - `scale`: None for 1/sqrt(head width), else the factor (1.0: T5's unscaled q·k);
    - `dropout`: applied to the float32 probabilities (cast inside it if the draw should see the
      compute dtype); None means no dropout, and the fused kernel runs.

    A query with no allowed key gets the mean of all values (a uniform softmax), on both paths.
    """
    if dropout is None:
        return jax.nn.dot_product_attention(q, k, v, bias=None if bias is None else bias.astype(q.dtype),
                                            mask=allowed, is_causal=is_causal, scale=scale)
    return _explicit(q, k, v, allowed, is_causal, bias, scale, dropout)


def _explicit(q: Array, k: Array, v: Array, allowed: Array | None, is_causal: bool, bias: Array | None,
              scale: float | None, dropout: Callable[[Array], Array]) -> Array:
    """Softmax attention with dropout on the probabilities, written out.

    A causal square runs in blocks of queries (`causal_blocks`), block i against the keys up to
    its own last query only: the later keys are masked for all its queries, so their scores,
    softmax, dropout draws and products with the values are skipped (at 8 blocks, 7/16 of the
    square). Every row is what the full square gives it: a masked key's probability is exactly 0.
    """
    length = q.shape[1]
    blocks = causal_blocks(length) if is_causal and length == k.shape[1] else 1
    size = length // blocks
    if allowed is None:
        allowed = jnp.ones((1, 1, 1, k.shape[1]), bool)
    ctx = []
    for i in range(blocks):
        lo, hi = i * size, (i + 1) * size
        end = hi if is_causal else k.shape[1]
        visible = allowed[:, :, lo:hi, :end] if allowed.shape[2] > 1 else allowed[..., :end]
        if is_causal:
            visible = visible & (jnp.arange(lo, hi)[:, None] >= jnp.arange(end)[None, :])
        block_bias = None if bias is None else (bias[:, :, lo:hi, :end] if bias.shape[2] > 1 else bias[..., :end])
        s = scores(q[:, lo:hi], k[:, :end], block_bias, scale)
        probs = dropout(jax.nn.softmax(jnp.where(visible, s, jnp.finfo(jnp.float32).min), axis=-1))
        ctx.append(jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v[:, :end]))
    return ctx[0] if blocks == 1 else jnp.concatenate(ctx, axis=1)
