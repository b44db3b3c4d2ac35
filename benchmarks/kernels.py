"""The memory-bound pieces of a BERT layer's train step, each written several ways and timed.

    python -m benchmarks.kernels [--tokens 4096,16384] [--reps 20] [--out runs/benchmarks]
    python -m benchmarks.kernels --smoke      # tiny shapes on CPU: the formulations agree (CI)

On an H100 the matrix products of BERT-base run near the chip's peak, and most of the rest of the
step is a few memory-bound pieces that XLA fuses as it sees fit: the bias gradients (a column sum
of a [tokens, features] gradient), LayerNorm forward and backward, and the erf GELU's backward.
Each piece here is one jitted forward + backward (or one reduction) on bf16 inputs of BERT-base's
widths, in every formulation listed; they take turns, so a clock change hits all alike. Printed
and appended to `--out/kernels.md|jsonl`: microseconds per call (median), the effective bandwidth
(the fewest bytes the piece must read and write over that time), the ratio to the first
formulation, and the largest difference from it relative to its largest value (the formulations
compute the same function; a large one is a bug).
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import report
from bertology.models import transformer

Array = jax.Array
BF16, F32 = jnp.bfloat16, jnp.float32


def column_sum_two_stage(g: Array, rows: int = 128) -> Array:
    """sum over axis 0 of [tokens, n] as two reductions: blocks of `rows` tokens, then the blocks."""
    t, n = g.shape
    if t % rows:
        return jnp.sum(g.astype(F32), axis=0)
    return jnp.sum(jnp.sum(g.reshape(t // rows, rows, n).astype(F32), axis=1), axis=0)


def bias_grad_pieces(t: int, n: int) -> tuple[dict[str, Callable], tuple, float]:
    """A bias's gradient: the column sum of a bf16 [t, n] gradient, in float32."""
    ones = jnp.ones((t,), BF16)
    pieces = {
        "sum": lambda g, ones: jnp.sum(g.astype(F32), axis=0),
        "two_stage": lambda g, ones: column_sum_two_stage(g),
        "ones_matmul": lambda g, ones: jnp.matmul(ones, g, preferred_element_type=F32),
    }
    g = jax.random.normal(jax.random.key(0), (t, n), F32).astype(BF16)
    return pieces, (g, ones), 2.0 * t * n


def dense_pieces(t: int, n: int, k: int = 768) -> tuple[dict[str, Callable], tuple, float]:
    """y = x @ w + b forward and backward (dx, dw, db), the bias gradient three ways."""
    def make(bias_grad: Callable[[Array], Array]) -> Callable:
        @jax.custom_vjp
        def add(y: Array, b: Array) -> Array:
            return y + b

        add.defvjp(lambda y, b: (y + b, None), lambda _, g: (g, bias_grad(g).astype(BF16)))

        def f(x, w, b, g):
            out, back = jax.vjp(lambda x, w, b: add(x @ w, b), x, w, b)
            return back(g)
        return f

    def autodiff(x, w, b, g):
        out, back = jax.vjp(lambda x, w, b: x @ w + b, x, w, b)
        return back(g)

    ones = lambda g: jnp.matmul(jnp.ones((g.shape[0],), g.dtype), g, preferred_element_type=F32)  # noqa: E731
    pieces = {"autodiff": autodiff, "two_stage": make(column_sum_two_stage), "ones_matmul": make(ones)}
    keys = jax.random.split(jax.random.key(1), 4)
    args = (jax.random.normal(keys[0], (t, k), F32).astype(BF16), (jax.random.normal(keys[1], (k, n), F32) * 0.03).astype(BF16),
            jnp.zeros((n,), BF16), jax.random.normal(keys[3], (t, n), F32).astype(BF16))
    return pieces, args, 2.0 * (2 * t * k + 2 * t * n + 2 * k * n)


def layer_norm_pieces(t: int, n: int) -> tuple[dict[str, Callable], tuple, float]:
    """LayerNorm of a bf16 [t, n] (float32 statistics, bf16 output) forward and backward."""
    flax_ln = nn.LayerNorm(epsilon=1e-12, dtype=BF16)

    def with_flax(x, scale, bias, g):
        return jax.vjp(lambda x, s, b: flax_ln.apply({"params": {"scale": s, "bias": b}}, x), x, scale, bias)[1](g)

    def written_out(x, scale, bias, g):
        return jax.vjp(lambda x, s, b: transformer.written_out_layer_norm(x, s, b, 1e-12, BF16), x, scale, bias)[1](g)

    keys = jax.random.split(jax.random.key(2), 3)
    args = (jax.random.normal(keys[0], (t, n), F32).astype(BF16), 1 + 0.1 * jax.random.normal(keys[1], (n,), F32),
            jnp.zeros((n,), F32), jax.random.normal(keys[2], (t, n), F32).astype(BF16))
    return {"flax": with_flax, "written_out": written_out}, args, 2.0 * 4 * t * n  # x, y; dy, dx


def gelu_pieces(t: int, n: int) -> tuple[dict[str, Callable], tuple, float]:
    """The erf GELU of a bf16 [t, n] forward and backward."""
    def autodiff(x, g):
        return jax.vjp(lambda x: nn.gelu(x, approximate=False), x)[1](g)

    def written_out(x, g):
        return jax.vjp(transformer.gelu, x)[1](g)

    keys = jax.random.split(jax.random.key(3), 2)
    args = tuple(jax.random.normal(k, (t, n), F32).astype(BF16) for k in keys)
    return {"autodiff": autodiff, "written_out": written_out}, args, 2.0 * 4 * t * n  # x, y; dy, dx


PIECES = {"bias_grad": (bias_grad_pieces, (768, 3072)), "dense": (dense_pieces, (768, 3072)),
          "layer_norm": (layer_norm_pieces, (768,)), "gelu": (gelu_pieces, (3072,))}


def largest_difference(a: Any, b: Any) -> float:
    """max |a - b| / max |b| over the leaves of two results."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
    return worst


def looped(fn: Callable, reps: int) -> Callable:
    """`fn` run `reps` + 1 times inside one jitted program: a Python call costs tens of µs of
    dispatch, as much as a small piece itself. Each run reads the last one's outputs through an
    optimisation barrier, so XLA cannot hoist the loop-invariant work out of the loop."""
    def run(*args: Any) -> Any:
        def body(_: Array, carry: Any) -> Any:
            return fn(*jax.lax.optimization_barrier((args, carry))[0])
        return jax.lax.fori_loop(0, reps, body, fn(*args))
    return jax.jit(run)


def time_turns(fns: list[Callable[[], Any]], calls: int, turns: int = 7) -> list[float]:
    """Median seconds per call of each (a call runs a piece `calls` times), over `turns` turns
    (the first warms up)."""
    times: list[list[float]] = [[] for _ in fns]
    for turn in range(turns + 1):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            if turn:
                times[i].append((time.perf_counter() - start) / calls)
    return [float(np.median(t)) for t in times]


def measure(piece: str, t: int, n: int, reps: int) -> list[dict[str, Any]]:
    make, _ = PIECES[piece]
    fns, args, nbytes = make(t, n)
    jitted = {name: jax.jit(fn) for name, fn in fns.items()}
    results = {name: fn(*args) for name, fn in jitted.items()}
    first = next(iter(results.values()))
    loops = [looped(fn, reps) for fn in fns.values()]
    seconds = time_turns([lambda fn=fn: fn(*args) for fn in loops], reps + 1)
    return [{"piece": piece, "shape": f"{t}x{n}", "formulation": name, "us": s * 1e6, "GB_per_s": nbytes / s / 1e9,
             "vs_first": seconds[0] / s, "difference": largest_difference(results[name], first)}
            for (name, s) in zip(jitted, seconds)]


COLUMNS = ["piece", "shape", "formulation", "us", "GB_per_s", "vs_first", "difference"]
FORMATS = {"us": "{:.1f}", "GB_per_s": "{:.0f}", "vs_first": "{:.2f}x", "difference": "{:.1e}"}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes: seconds on a CPU")
    p.add_argument("--tokens", default="4096,16384", help="token counts (BERT-base 32x128 and 32x512)")
    p.add_argument("--pieces", default=",".join(PIECES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default="runs/benchmarks")
    args = p.parse_args(argv)
    tokens = [256] if args.smoke else [int(t) for t in args.tokens.split(",")]
    rows = []
    for piece in args.pieces.split(","):
        for t in tokens:
            for n in PIECES[piece][1]:
                measured = measure(piece, t, n, 2 if args.smoke else args.reps)
                report.append(measured, pathlib.Path(args.out), "kernels", COLUMNS, FORMATS)
                rows.extend(measured)
    return rows


if __name__ == "__main__":
    main()
