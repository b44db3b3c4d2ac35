"""Reversible residual layers (Gomez et al. 2017, "The Reversible Residual Network", arXiv
1707.04585; used by the Reformer, Kitaev et al. 2020, arXiv 2001.04451, section 3) with a
backward pass that recomputes each layer's input from its output instead of storing it.

A layer holds two residual streams and two blocks f (the Reformer's attention) and g (its
feed-forward block):

    y1 = x1 + f(x2)        y2 = x2 + g(y1)

so its input is recoverable from its output: x2 = y2 - g(y1), x1 = y1 - f(x2). `stack` runs
the layers with a `jax.custom_vjp` whose forward pass keeps only the last layer's output (plus
each block's `hints`, below); its backward pass walks the layers from the top, recomputing g(y1)
and f(x2) under `jax.vjp` to get their gradients and, by subtraction, the layer's input. So the
activations held for the backward pass do not grow with depth: one layer's worth lives at a
time, at the price of running each block's forward pass twice (Hugging Face's
`_ReversibleFunction` and `ReformerLayer.backward_pass`, transformers 4.57.6
`models/reformer/modeling_reformer.py` 1620-1798, do the same in torch).

A block is a pure function `block(params, x, context, hints) -> (output, hints)`:
- `params`: its parameters (the gradient comes back for them);
- `context`: the layer's non-differentiable inputs (masks, dropout keys, LSH rotations), the
  same on both passes, so dropout draws the same mask when the block is recomputed;
- `hints`: what the forward pass computed from the input and the backward pass must reuse
  rather than recompute (the LSH buckets: the reconstructed x2 differs from the original by
  rounding, which could move a near-tie to another bucket and change the function whose
  gradient is taken; HF caches the buckets for the same reason). The forward pass calls each
  block with `hints=None` and keeps what it returns; the backward pass passes that back in.

`forward` is the same computation without the custom gradient (autodiff stores every layer's
activations), returning every layer's x2 stream as well: evaluation, and the reference the
tests compare `stack`'s gradients with.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax

Array = jax.Array
Block = Callable[[Any, Array, Any, Any], tuple[Array, Any]]
Layer = tuple[Block, Block]  # (f, g)


def forward(layers: Sequence[Layer], params: Sequence[tuple[Any, Any]], x1: Array, x2: Array,
            contexts: Sequence[Any]) -> tuple[Array, Array, list[Array], list[tuple[Any, Any]]]:
    """(y1, y2, the x2 stream before each layer and after the last, each block's hints), by plain
    autodiff-able code."""
    states, hints = [x2], []
    for (f, g), (pf, pg), context in zip(layers, params, contexts):
        fx, hf = f(pf, x2, context, None)
        x1 = x1 + fx
        gy, hg = g(pg, x1, context, None)
        x2 = x2 + gy
        states.append(x2)
        hints.append((hf, hg))
    return x1, x2, states, hints


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def stack(layers: tuple[Layer, ...], params: tuple[tuple[Any, Any], ...], x1: Array, x2: Array,
          contexts: tuple[Any, ...]) -> tuple[Array, Array]:
    """(y1, y2) of the reversible layers, with the memory-saving backward pass (module docstring).
    `layers`: the (f, g) pairs (static); `params` and `contexts`: one entry per layer."""
    y1, y2, _, _ = forward(layers, params, x1, x2, contexts)
    return y1, y2


def _stack_fwd(layers: tuple[Layer, ...], params: tuple[tuple[Any, Any], ...], x1: Array, x2: Array,
               contexts: tuple[Any, ...]) -> tuple[tuple[Array, Array], tuple]:
    y1, y2, _, hints = forward(layers, params, x1, x2, contexts)
    return (y1, y2), (params, contexts, y1, y2, hints)


def _stack_bwd(layers: tuple[Layer, ...], residuals: tuple, cotangents: tuple[Array, Array]) -> tuple:
    params, contexts, y1, y2, hints = residuals
    dy1, dy2 = cotangents
    grads = []
    for (f, g), (pf, pg), context, (hf, hg) in reversed(list(zip(layers, params, contexts, hints))):
        gy, g_vjp = jax.vjp(lambda p, y: g(p, y, context, hg)[0], pg, y1)
        x2 = y2 - gy
        dpg, dy1_g = g_vjp(dy2)
        dy1 = dy1 + dy1_g
        fx, f_vjp = jax.vjp(lambda p, x: f(p, x, context, hf)[0], pf, x2)
        x1 = y1 - fx
        dpf, dx2_f = f_vjp(dy1)
        dy2 = dy2 + dx2_f
        y1, y2 = x1, x2
        grads.append((dpf, dpg))
    return tuple(reversed(grads)), dy1, dy2, None


stack.defvjp(_stack_fwd, _stack_bwd)
