"""int8 against float32 inference of a BERT classifier on this CPU: weight bytes and examples/s.

    python -m benchmarks.quantized [--preset mini] [--batch_size 32] [--seq_len 128] [--repeats 10]

Three ways to run the same network (random weights of a BERT preset, the ranges set from one
batch, as after quantization-aware training; `bertology.train.quantize`):
- float32: the plain `TaskModel`;
- fake-quantized: every product on float-valued integers in float32 (what Q8BERT trains with,
  and all its reference code ever runs: Q8#154/#162);
- int8: the same products as int8 x int8 -> int32 `dot_general`s on `int8_params` (4x smaller
  kernels and tables).
It also times one bare [B·L, H] x [H, 4H] product in each dtype, to show what XLA:CPU does with
an int8 dot_general on its own, and prints the optimized HLO's ops for it.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertology import models
from bertology.models.presets import bert_preset
from bertology.models.tasks import TaskModel
from bertology.train import quantize as qz


def _rate(fn: Callable[[], Any], rows: int, repeats: int) -> float:
    """Rows per second of `fn` after one compile-and-warm-up call (best of `repeats`)."""
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return rows / best


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    cfg = models.encoder_config({"family": "bert", "vocab_size": 8192, "max_position_embeddings": args.seq_len,
                                 **bert_preset(args.preset)})
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(1, 8192, (args.batch_size, args.seq_len)).astype(np.int32),
             "input_mask": np.ones((args.batch_size, args.seq_len), np.int32),
             "segment_ids": np.zeros((args.batch_size, args.seq_len), np.int32)}
    fake = qz.QuantizedTaskModel(cfg, "classification", 2)
    params = nn.meta.unbox(fake.init(jax.random.key(0), batch)["params"])
    seen = jax.grad(lambda q: fake.apply({"params": q}, batch)["logits"].sum())(params)
    params = jax.tree.map(lambda a, g, r: g if r else a, params, seen, qz.is_range(params))
    int8 = qz.int8_params(params)
    plain = TaskModel(cfg, "classification", 2)
    runs = {
        "float32": (jax.jit(lambda q, b: plain.apply({"params": q}, b)["logits"]), params),
        "fake-quantized": (jax.jit(lambda q, b: fake.apply({"params": q}, b)["logits"]), params),
        "int8": (jax.jit(lambda q, b: qz.QuantizedTaskModel(cfg, "classification", 2, int8=True).apply(
            {"params": q}, b)["logits"]), int8),
    }
    out: dict[str, float] = {}
    print(f"BERT-{args.preset} classifier, batch {args.batch_size} x {args.seq_len}, {jax.devices()[0].device_kind}")
    print(f"weights: float32 {qz.nbytes(params) / 2**20:.2f} MiB, int8 {qz.nbytes(int8) / 2**20:.2f} MiB "
          f"({qz.nbytes(params) / qz.nbytes(int8):.2f}x smaller)")
    for name, (fn, q) in runs.items():
        out[name] = _rate(lambda: fn(q, batch), args.batch_size, args.repeats)
        print(f"{name:>15}: {out[name]:8.1f} examples/s")
    logits = {name: np.asarray(fn(q, batch)) for name, (fn, q) in runs.items()}
    print(f"int8 vs fake-quantized logits: max abs diff {np.abs(logits['int8'] - logits['fake-quantized']).max():.2e} "
          f"(logits up to {np.abs(logits['float32']).max():.2e}; an activation on a rounding tie may land one "
          f"step apart when XLA fuses the two paths' float ops differently)")

    m, h = args.batch_size * args.seq_len, cfg.hidden_size
    x, w = rng.standard_normal((m, h)).astype(np.float32), rng.standard_normal((h, 4 * h)).astype(np.float32)
    xi, wi = (np.clip(np.round(a * 20), -127, 127).astype(np.int8) for a in (x, w))
    f32 = jax.jit(lambda a, b: a @ b)
    i8 = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32))
    for name, fn, a, b in (("matmul float32", f32, x, w), ("matmul int8->int32", i8, xi, wi)):
        out[name] = _rate(lambda: fn(a, b), m, args.repeats)
        print(f"{name:>19} [{m}x{h}]x[{h}x{4 * h}]: {out[name] / 1e3:8.1f} k rows/s")
    hlo = i8.lower(xi, wi).compile().as_text()
    ops = sorted(set(re.findall(r"= (?:s32|s8|f32)\[[^\]]*\][^ ]* (\w+(?:-\w+)*)\(", hlo)))
    calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    print(f"XLA:CPU int8 dot_general compiles to ops {ops}" + (f", custom calls {calls}" if calls else ""))
    return out


if __name__ == "__main__":
    main()
