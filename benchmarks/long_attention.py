"""Memory and time per token of one training step against row length: full attention and each
sparse scheme, one model size, one process.

    python -m benchmarks.long_attention [--lengths 512,1024,2048,4096,8192,16384] [--schemes full,longformer]
                                        [--window 256] [--max_gib 16] [--steps 3] [--backend auto]
                                        [--dtype bfloat16]
    python -m benchmarks.long_attention --smoke      # two short lengths, tiny model: ~3 min on 2 CPU cores, compiling

Every scheme runs the same trunk size (`SIZE`: 2 layers, hidden 256, 4 heads of 64, FFN 1024,
a 2048-token table so the output layer does not hide the attention) under its family's MLM
objective, one row per step, 15% of its tokens predicted:
- `full`: RoBERTa, every query against every key (the [L, L] square);
- `longformer`: Longformer's sliding window (`--window` keys in all, half on each side; no
  global tokens), banded in O(L · window) on xla;
- `bigbird`: BigBird's block-sparse attention (blocks of `--window` / 4 tokens: each query
  block sees a 3-block window, 2 random blocks and the first and last blocks, 7 blocks in all);
- `reformer`: the Reformer's masked LM (`configs/reformer.py:tiny_mlm`, HF's
  `ReformerForMaskedLM`): a local layer then an LSH layer (HF's alternation; 2 hashing rounds
  into HF's 2 · length / chunk buckets), both over chunks of `--window` / 2 each seeing the
  chunk before (`--window` keys, a round), in reversible layers whose backward pass recomputes each layer's
  input; a learned position table like the others' (not axial), an output layer over both
  streams (2 x hidden wide).

For each (scheme, length) it compiles the step, reads XLA's plan (`memory_analysis`: the
temporaries, which hold the activations the backward pass keeps, per token), and, where the plan
is under `--max_gib`, times `--steps` steps (median). A sparse scheme should be flat in memory and
time per token once the row is longer than its window, and full attention should grow linearly in
both (the square over the row); the summary gives each scheme's growth factor from the shortest
to the longest length it ran, and the shortest length where it beats full attention in tokens/s.
Rows go to `--out/long_attention.{jsonl,md}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from typing import Any, Callable

import numpy as np

from benchmarks import report
from benchmarks.accelerator import ours_step, versions
from benchmarks.train_step import random_batch, recipe_config
from bertology import models

SIZE = dict(num_layers=2, hidden_size=256, num_heads=4, intermediate_size=1024)
SMOKE_SIZE = dict(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
VOCAB = 2048
GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Scheme:
    name: str
    recipe: str  # configs/<recipe>.py
    model: Callable[[int], dict[str, Any]]  # window -> the scheme's model settings
    preset: str = "tiny"

    def config(self, length: int, window: int, size: dict[str, int], backend: str, dtype: str = "float32") -> Any:
        c = recipe_config(self.recipe, self.preset, VOCAB, dtype, "none")
        c.model.update(size, **self.model(window), max_position_embeddings=length + c.model.get("position_offset", 0),
                       dropout_rate=0.0, attention_dropout_rate=0.0)
        if backend != "xla" and self.name == "full":  # the sparse families compute on xla alone
            c.model.attention_backend = backend
        c.data.max_seq_length, c.data.max_predictions_per_seq = length, max(1, int(0.15 * length))
        return c


SCHEMES = (
    Scheme("full", "roberta", lambda window: {}),
    Scheme("longformer", "longformer", lambda window: {"attention_window": [window], "max_global_tokens": 1}),
    # blocks of window / 4: a query block sees its 3-block window, 2 random blocks and the 2 global ones
    Scheme("bigbird", "bigbird", lambda window: {"sparse_block_size": window // 4, "num_random_blocks": 2}),
    # local then LSH layers (HF's pattern: the smoke's one layer is local) over chunks of window / 2, each
    # seeing the chunk before; buckets by HF's rule (None)
    Scheme("reformer", "reformer", lambda window: {
        "attn_layers": None, "num_hashes": 2, "num_buckets": None, "lsh_attn_chunk_length": window // 2,
        "local_attn_chunk_length": window // 2, "lsh_num_chunks_after": 0, "local_num_chunks_after": 0,
        "lsh_attention_dropout_rate": 0.0, "axial_pos_embds": False}, preset="tiny_mlm"),
)


def measure(scheme: Scheme, length: int, window: int, size: dict[str, int], steps: int, max_gib: float,
            backend: str, dtype: str = "float32") -> dict[str, Any]:
    config = scheme.config(length, window, size, backend, dtype)
    batch = random_batch(models.encoder_config(config.model), 1, length, config.data.max_predictions_per_seq)
    batch["segment_ids"] = np.zeros_like(batch["segment_ids"])  # one segment type in every scheme
    row: dict[str, Any] = {"scheme": scheme.name, "length": length, "window": window if scheme.name != "full" else None,
                           "dtype": dtype}
    # compiled first: a length whose plan is over `max_gib` is never allocated
    step, row["setup_s"], memory = ours_step(config, batch, max_bytes=max_gib * GiB)
    if memory is not None:
        row["temp_mib"] = memory.temp_size_in_bytes / 2**20
        row["bytes_per_token"] = memory.temp_size_in_bytes / length
    if step is None:
        row["skipped"] = f"plan over {max_gib} GiB"
        return row
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    row["step_ms"] = float(np.median(times)) * 1e3
    row["us_per_token"] = row["step_ms"] * 1e3 / length
    row["tokens_per_s"] = length / (row["step_ms"] / 1e3)
    return row


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per scheme: growth of memory and time per token from its shortest to its longest timed
    length, and the shortest length where it beats full attention in tokens/s."""
    full = {r["length"]: r.get("tokens_per_s") for r in rows if r["scheme"] == "full"}
    lines = []
    for name in dict.fromkeys(r["scheme"] for r in rows):
        timed = [r for r in rows if r["scheme"] == name and r.get("tokens_per_s")]
        if len(timed) < 2:
            continue
        first, last = timed[0], timed[-1]
        memory, per_token = (last[k] / first[k] for k in ("bytes_per_token", "us_per_token"))
        wins = [r["length"] for r in timed if full.get(r["length"]) and r["tokens_per_s"] > full[r["length"]]]
        beyond_full = [r["length"] for r in timed if r["length"] not in full or full[r["length"]] is None]
        lines.append(
            f"{name}: {first['length']} -> {last['length']} tokens ({last['length'] / first['length']:.0f}x): "
            f"memory/token x{memory:.2f}, time/token x{per_token:.2f}"
            + ("" if name == "full" else f"; faster than full from {min(wins) if wins else 'no measured length'}")
            + (f"; runs where full does not fit: {beyond_full}" if beyond_full and name != "full" else ""))
    return lines


COLUMNS = ["scheme", "length", "window", "dtype", "temp_mib", "bytes_per_token", "step_ms", "us_per_token", "tokens_per_s",
           "setup_s", "skipped"]
FORMATS = {"temp_mib": "{:,.1f}", "bytes_per_token": "{:,.0f}", "step_ms": "{:.1f}", "us_per_token": "{:.2f}",
           "tokens_per_s": "{:,.0f}", "setup_s": "{:.1f}"}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny model at two short lengths: minutes on a CPU, compiling")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--schemes", default=",".join(s.name for s in SCHEMES))
    p.add_argument("--window", type=int, default=256, help="the sparse schemes' window (tokens in all)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max_gib", type=float, default=16.0, help="skip a step whose XLA plan is larger")
    p.add_argument("--backend", default="xla", help="full attention's model.attention_backend (auto on a GPU/TPU)")
    p.add_argument("--dtype", default="float32", help="compute dtype (bfloat16: what cuDNN's fused kernel takes)")
    p.add_argument("--out", default="runs/benchmarks")
    args = p.parse_args(argv)
    lengths = [64, 128] if args.smoke else [int(x) for x in args.lengths.split(",")]
    window, size = (16, SMOKE_SIZE) if args.smoke else (args.window, SIZE)
    wanted = args.schemes.split(",")
    unknown = sorted(set(wanted) - {s.name for s in SCHEMES})
    if unknown:
        p.error(f"unknown schemes {unknown}; known: {', '.join(s.name for s in SCHEMES)}")
    info = versions()
    print(json.dumps(info), flush=True)
    rows = []
    for length in lengths:
        for scheme in (s for s in SCHEMES if s.name in wanted):
            row = measure(scheme, length, window, size, 1 if args.smoke else args.steps, args.max_gib, args.backend,
                          args.dtype)
            row["device"] = info["device"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = pathlib.Path(args.out)
    report.append(rows, out, "long_attention", COLUMNS, FORMATS)
    lines = summary(rows)
    print("\n".join(lines))
    with open(out / "long_attention.md", "a") as f:
        f.write(f"\n{json.dumps(info)}\n\n" + "".join(f"- {line}\n" for line in lines))
    return rows


if __name__ == "__main__":
    main()
