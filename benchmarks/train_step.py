"""Train-step throughput of BERT pretraining, ours against Hugging Face Flax, in one process.

    python -m benchmarks.train_step --preset base --batch_size 16 [--peak_flops 989e12]

Both run the same batch shapes, the same loss (MLM at the gathered positions + NSP, dropout on)
and the same optax AdamW step built from the config; only the model code differs. Prints the
tokens/s of each, our counted FLOPs/token and MFU (with --peak_flops), and the ratio (of wall
time, and of this process's CPU time, which other jobs on a shared machine cannot inflate); appends a
JSON line to --out/train_step.jsonl and a markdown row to --out/train_step.md. The GPT-2
version (`benchmarks.train_step_gpt`) reuses the timing and reporting here.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import pathlib
import sys
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from benchmarks import report
from bertology import models, objectives
from bertology.models.transformer import TransformerConfig
from bertology.train import optimizer as optimizer_lib
from bertology.train.step import fresh_state, make_train_step, param_init

REPO = pathlib.Path(__file__).resolve().parents[1]


def recipe_config(recipe: str, preset: str, vocab_size: int, dtype: str, remat: str) -> Any:
    """configs/<recipe>.py's config for `preset`, with the benchmark's vocab, dtype and remat."""
    sys.path.insert(0, str(REPO / "configs"))
    c = importlib.import_module(recipe).get_config(preset)
    c.model.vocab_size, c.model.dtype, c.model.remat = vocab_size, dtype, remat
    return c


bert_config = functools.partial(recipe_config, "bert")


def random_batch(cfg: TransformerConfig, batch: int, length: int, predictions: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A pretraining batch of the right shapes and dtypes; the values do not affect speed."""
    rng = np.random.default_rng(seed)
    positions = np.sort(np.stack([rng.choice(np.arange(1, length), predictions, replace=False) for _ in range(batch)]), 1)
    return {
        "input_ids": rng.integers(0, cfg.vocab_size, (batch, length), dtype=np.int32),
        "segment_ids": (np.arange(length) >= length // 2).astype(np.int32)[None].repeat(batch, 0),
        "input_mask": np.ones((batch, length), np.int32),
        "masked_positions": positions.astype(np.int32),
        "masked_ids": rng.integers(0, cfg.vocab_size, (batch, predictions), dtype=np.int32),
        "masked_weights": np.ones((batch, predictions), np.float32),
        "next_sentence_label": rng.integers(0, 2, (batch,), dtype=np.int32),
    }


def seconds_per_step(runs: list[tuple[Callable, Any]], batch: dict, steps: int, warmup: int = 2) -> list[dict]:
    """Median wall and process-CPU seconds of a step of each (step, state), after `warmup` steps.

    The runs take turns step by step, so a load change on a shared machine hits all of them
    alike; CPU seconds (all threads of this process) are what other processes cannot inflate.
    """
    key = jax.random.key(0)
    batch = jax.device_put(batch)
    states = [state for _, state in runs]
    times: list[dict[str, list[float]]] = [{"wall": [], "cpu": []} for _ in runs]
    for i in range(warmup + steps):
        for r, (step, _) in enumerate(runs):
            wall, cpu = time.perf_counter(), time.process_time()
            states[r], metrics = step(states[r], batch, key)
            jax.block_until_ready(metrics)
            if i >= warmup:
                times[r]["wall"].append(time.perf_counter() - wall)
                times[r]["cpu"].append(time.process_time() - cpu)
    return [{k: float(np.median(v)) for k, v in t.items()} for t in times]


def jitted_step(model: Any, loss_fn: Callable, params: Any, config: Any) -> tuple[Callable, dict]:
    tx, lr = optimizer_lib.make(config.optimizer, config.total_steps)
    return jax.jit(make_train_step(model, loss_fn, tx, lr, 1), donate_argnums=(0,)), fresh_state(params, tx)


def ours(config: Any, batch: dict) -> tuple[Callable, dict]:
    model = models.build(config.model)
    example = {k: v[:1] for k, v in batch.items()}
    params = jax.jit(lambda k: nn.meta.unbox(param_init(model, example)(k)))(jax.random.key(0))
    return jitted_step(model, objectives.get(config.objective), params, config)


def theirs(config: Any) -> tuple[Callable, dict]:
    from benchmarks.reference import hf_loss, hf_model

    model = hf_model(models.encoder_config(config.model))
    return jitted_step(model, hf_loss, model.params, config)


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`p`'s arguments plus the flags every train-step benchmark shares (dtype, remat, steps,
    peak FLOP/s, skipping the reference, output directory), parsed from `argv`."""
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--remat", default="none", choices=("none", "full", "dots_saveable"))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--peak_flops", type=float, default=None, help="the device's peak FLOP/s, for MFU")
    p.add_argument("--no_reference", action="store_true", help="skip Hugging Face (e.g. on a GPU run)")
    p.add_argument("--out", default="runs/benchmarks")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20, help="max_predictions_per_seq (gathered MLM positions)")
    p.add_argument("--vocab_size", type=int, default=30522, help="BERT's uncased vocabulary size")
    args = parse_args(p, argv)

    config = bert_config(args.preset, args.vocab_size, args.dtype, args.remat)
    config.data.max_seq_length, config.data.max_predictions_per_seq = args.seq_len, args.predictions
    cfg = models.encoder_config(config.model)
    batch = random_batch(cfg, args.batch_size, args.seq_len, args.predictions)
    return measure(args, config, batch, theirs, "train_step")


def measure(args: argparse.Namespace, config: Any, batch: dict, reference: Callable[[Any], tuple[Callable, dict]],
            name: str, **shape: Any) -> dict[str, Any]:
    """Time our step (and `reference(config)`'s unless --no_reference) on `batch`, then record the
    row under `args.out/<name>`: the one measurement every train-step benchmark reports. `shape`:
    further batch dimensions the row keeps (a seq2seq target length)."""
    row: dict[str, Any] = dict(
        preset=args.preset, batch_size=args.batch_size, seq_len=args.seq_len, **shape, dtype=args.dtype,
        remat=args.remat, vocab_size=args.vocab_size, device=jax.devices()[0].device_kind, device_count=1,
        flops_per_token=models.flops_per_token(config),
    )
    runs = [ours(config, batch)] + ([] if args.no_reference else [reference(config)])
    row.update(throughput(runs, batch, args.steps, row["flops_per_token"], args.peak_flops))
    report.append([row], pathlib.Path(args.out), name, COLUMNS, FORMATS)
    return row


def throughput(runs: list[tuple[Callable, Any]], batch: dict[str, np.ndarray], steps: int, flops_per_token: float,
               peak_flops: float | None) -> dict[str, float | None]:
    """Our tokens/s (runs[0]) and MFU; with a reference (runs[1]) its tokens/s and the ratios,
    ours over theirs, of wall time and of CPU time."""
    tokens = batch["input_ids"].size
    seconds = seconds_per_step(runs, batch, steps)
    out: dict[str, float | None] = {"tokens_per_s": tokens / seconds[0]["wall"]}
    out["mfu"] = out["tokens_per_s"] * flops_per_token / peak_flops if peak_flops else None
    if len(runs) > 1:
        out["hf_tokens_per_s"] = tokens / seconds[1]["wall"]
        out["ratio"] = out["tokens_per_s"] / out["hf_tokens_per_s"]
        out["cpu_ratio"] = seconds[1]["cpu"] / seconds[0]["cpu"]
    return out


COLUMNS = ["preset", "batch_size", "seq_len", "dtype", "remat", "device", "tokens_per_s", "flops_per_token", "mfu",
           "hf_tokens_per_s", "ratio", "cpu_ratio"]
FORMATS = {"tokens_per_s": "{:,.0f}", "hf_tokens_per_s": "{:,.0f}", "flops_per_token": "{:.3g}", "mfu": "{:.1%}",
           "ratio": "{:.2f}x", "cpu_ratio": "{:.2f}x"}


if __name__ == "__main__":
    main()
