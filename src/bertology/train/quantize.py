"""Q8BERT (Zafrir et al. 2019): 8-bit quantization-aware fine-tuning, and int8 inference.

The quantizer (Q8 `nlp_architect/nn/torch/quantization.py`) is symmetric and per tensor:
q = clamp(round(x·s), -127, 127) with s = 127 / max|x|. Weights (every Dense kernel: Q, K, V,
attention output, FFN, pooler, the task head; and the embedding tables) take their scale from
their own max-abs at every step; the input of every Dense takes its scale from `input_range`, an
exponential moving average of the max|x| seen in training (decay 0.9999; the first batch's max
when it is still 0). Gradients pass straight through the rounding. Softmax, LayerNorm, GELU and
the residual stream stay float32, as in the reference (Q8#154); biases stay float32 too (the
reference keeps them as int32 at scale s_w·s_x: a rounding below s_w·s_x/2, invisible next to
the inputs' own).

How it is wired without touching the Transformer: `QuantizedTaskModel` is the fine-tuning
`TaskModel` run under a flax method interceptor that replaces every `nn.Dense`/`HeadsDense`
product by `dot(q(x), q(W)) / (s_x·s_W) + b` and every embedding lookup by its quantized table.
The same function serves both modes: during training the q(·) are float (fake quantization) and
the product a float32 matmul; at inference (`int8=True`, parameters from `int8_params`) they are
int8 arrays, the product an int8 x int8 -> int32 `dot_general`. Products of int8 values summed
in float32 are exact while the sum stays below 2^24 (127² · 1040 terms), so both modes agree to
float32 rounding of the final rescale.

Where the ranges live: `input_range` is a scalar parameter beside each kernel, so it is
checkpointed and exported with the model, but the optimizer never trains it: `ema_ranges` wraps
the optimizer, gives the inner one a zero gradient for every range, and sets each range to its
moving average. The observed max|x| reaches it through the only channel a train step has from the
forward pass to the update, the gradient: `observe` is the identity on the range with a custom
backward pass that returns the batch's max|x| (so `grad_norm` also counts these maxima). That
channel sums over microbatches, hence quantization refuses `grad_accum_steps` > 1.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertology.models.tasks import TaskModel
from bertology.models.transformer import HeadsDense

Array = jax.Array
QMAX = 127.0
RANGE = "input_range"


def scale_of(max_abs: Array) -> Array:
    """The symmetric int8 scale s = 127 / max|x| (1 for an all-zero tensor)."""
    return QMAX / jnp.where(max_abs > 0, max_abs, QMAX)


def quantize(x: Array, scale: Array) -> Array:
    """round(x·s) clamped to ±127, as float (integral values)."""
    return jnp.clip(jnp.round(x * scale), -QMAX, QMAX)


def fake_int(x: Array, scale: Array) -> Array:
    """`quantize` with a straight-through gradient: forward exactly the integers (so the int8
    path computes the same products), backward d/dx (x·s)."""
    scaled = x * scale
    return jax.lax.stop_gradient(quantize(x, scale)) + (scaled - jax.lax.stop_gradient(scaled))


@jax.custom_vjp
def observe(x: Array, running: Array) -> Array:
    """The range to quantize `x` with: `running` (the moving average), or max|x| while it is 0.
    Backward: no gradient to `x` through the range, and max|x| to `running` (see the module docstring)."""
    return jnp.where(running > 0, running, jnp.max(jnp.abs(x)))


def _observe_fwd(x: Array, running: Array) -> tuple[Array, Array]:
    return observe(x, running), x  # x is kept for the product's backward pass anyway


def _observe_bwd(x: Array, _: Array) -> tuple[Array, Array]:
    return jnp.zeros_like(x), jnp.max(jnp.abs(x)).astype(jnp.float32)


observe.defvjp(_observe_fwd, _observe_bwd)


def _dense(module: nn.Module, x: Array, int8: bool) -> Array:
    """A Dense or HeadsDense product on quantized operands (see the module docstring)."""
    params = nn.meta.unbox(module.variables["params"])
    kernel = params["kernel"]
    x = x.astype(jnp.float32)
    x_scale = scale_of(observe(x, params[RANGE]))
    if int8:
        x_q, k_q, k_scale = quantize(x, x_scale).astype(jnp.int8), kernel, params["kernel_scale"]
    else:
        k_scale = jax.lax.stop_gradient(scale_of(jnp.max(jnp.abs(kernel))))
        x_q, k_q = fake_int(x, x_scale), fake_int(kernel, k_scale)
    contract = 2 if isinstance(module, HeadsDense) and not module.to_heads else 1
    dims = ((tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract))), ((), ()))
    y = jax.lax.dot_general(x_q, k_q, dims, preferred_element_type=jnp.int32 if int8 else jnp.float32)
    y = y.astype(jnp.float32) / (x_scale * k_scale)
    return y + params["bias"] if "bias" in params else y


def _embed(module: nn.Embed, ids: Array, int8: bool) -> Array:
    params = nn.meta.unbox(module.variables["params"])
    table = params["embedding"]
    if int8:
        q, scale = table, params["embedding_scale"]
    else:
        scale = jax.lax.stop_gradient(scale_of(jnp.max(jnp.abs(table))))
        q = fake_int(table, scale)
    return (jnp.take(q, ids, axis=0).astype(jnp.float32) / scale).astype(module.dtype or jnp.float32)


class QuantizedTaskModel(TaskModel):
    """`TaskModel` with Q8BERT's quantization (see the module docstring); the same parameters
    plus an `input_range` beside every kernel. `int8`: run on `int8_params`' integers."""

    int8: bool = False

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 language_model: bool = False) -> dict[str, Array]:
        def interceptor(next_fun, args, kwargs, context):
            module = context.module
            if context.method_name != "__call__" or not isinstance(module, (nn.Dense, HeadsDense, nn.Embed)):
                return next_fun(*args, **kwargs)
            if isinstance(module, nn.Embed):
                if not module.has_variable("params", "embedding"):  # init
                    return next_fun(*args, **kwargs)
                return _embed(module, args[0], self.int8)
            if not module.has_variable("params", "kernel"):  # init: the module's own parameters, and the range
                module.param(RANGE, nn.initializers.zeros_init(), (), jnp.float32)
                return next_fun(*args, **kwargs)
            return _dense(module, args[0], self.int8)

        with nn.intercept_methods(interceptor):
            return super().__call__(batch, deterministic=deterministic, language_model=language_model)


def is_range(params: Any) -> Any:
    """A tree of bools: which leaves are activation ranges."""
    return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], "key", None) == RANGE, params)


class EmaState(NamedTuple):
    inner: Any


def ema_ranges(inner: optax.GradientTransformation, decay: float = 0.9999) -> optax.GradientTransformation:
    """`inner` on every parameter but the ranges; each range becomes decay·range + (1-decay)·seen
    (`seen`: its gradient, the batch's max|x|; a range still at 0 takes `seen`)."""

    def init(params: Any) -> EmaState:
        return EmaState(inner.init(params))

    def update(grads: Any, state: EmaState, params: Any = None) -> tuple[Any, EmaState]:
        ranges = is_range(grads)
        inner_grads = jax.tree.map(lambda r, g: jnp.zeros_like(g) if r else g, ranges, grads)
        updates, inner_state = inner.update(inner_grads, state.inner, params)

        def moved(r, u, g, p):
            if not r:
                return u
            return jnp.where(p > 0, decay * p + (1 - decay) * g, g) - p

        return jax.tree.map(moved, ranges, updates, grads, params), EmaState(inner_state)

    return optax.GradientTransformation(init, update)


def int8_params(params: Any) -> Any:
    """The parameters for int8 inference: every kernel and embedding table as int8 with its
    float32 scale beside it (`kernel_scale`, `embedding_scale`); everything else as it was."""

    def convert(tree: Any) -> Any:
        if not isinstance(tree, dict):
            return tree
        out = {k: convert(v) for k, v in tree.items()}
        for name in ("kernel", "embedding"):
            if name in tree and (name == "embedding" or RANGE in tree):
                w = jnp.asarray(tree[name], jnp.float32)
                scale = scale_of(jnp.max(jnp.abs(w)))
                out[name], out[f"{name}_scale"] = quantize(w, scale).astype(jnp.int8), scale
        return out

    return convert(params)


def nbytes(params: Any) -> int:
    """Bytes the parameters take (int8 tensors one byte per value)."""
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
