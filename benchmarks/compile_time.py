"""Compile time of the BERT pretraining train step with and without scanned layers.

    python -m benchmarks.compile_time [--presets base,large] [--remat none,full] [--batch_size 8] [--seq_len 128]

`model.scan_layers=true` runs the layer stack with `nn.scan`: XLA compiles one layer (its
parameters stacked on a leading `layers` axis) instead of N copies of it. For each preset x remat
x scan this times `jax.jit(step).lower(...)` (tracing to StableHLO) and `.compile()` (XLA)
separately, for the whole train step (forward, backward, AdamW), on abstract inputs
(`jax.eval_shape`: nothing is allocated, so BERT-large costs no memory), and reads the compiled
step's memory from XLA's `memory_analysis()`. Every measurement runs in a fresh Python process:
jax keeps traces and executables per process, so a second lowering or compile in the same one
would be measured nearly free.

For the presets in `--step_presets` (base by default) the same process then allocates the state
and runs real steps, so the table shows what scan costs at run time (the scanned stack also runs
its last layer at every position, where the unscanned one runs it only at the gathered MLM rows:
`models/transformer.py`, `Stack`). Both layouts start from the same weights (the unscanned
initialisation, stacked for the scanned stack), so with `--dropout 0` their losses agree to
rounding; with dropout on, the two layouts draw different dropout masks.

Appends one JSON line per measurement to --out/compile_time.jsonl and a markdown row to
--out/compile_time.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
import optax

from benchmarks import report
from benchmarks.train_step import REPO, bert_config, random_batch
from bertology import models, objectives
from bertology.models.transformer import stack_layers
from bertology.train import optimizer as optimizer_lib
from bertology.train.step import fresh_state, make_train_step, param_init, state_init

MiB = 2**20


def train_step(config: Any, model: nn.Module) -> tuple[Callable, optax.GradientTransformation]:
    """(state, batch, key) -> (state, metrics) for `config`, and its optimizer: the one place this
    benchmark builds the train step, as benchmarks/train_step.py does."""
    tx, lr = optimizer_lib.make(config.optimizer, config.total_steps)
    return make_train_step(model, objectives.get(config.objective), tx, lr, config.grad_accum_steps), tx


class Clock:
    """Wall and process-CPU seconds since the last lap. CPU seconds (all threads of this process)
    are what other jobs on a shared machine cannot inflate, unlike wall time."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        lap = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return lap


def measure(preset: str, remat: str, scan: bool, batch_size: int, seq_len: int, predictions: int, vocab_size: int,
            steps: int, dropout: float | None) -> dict[str, Any]:
    """One row of the table, measured in this process (call it in a fresh one: see the module doc).

    With `steps` > 0, also the median seconds of `steps` real steps after one warm-up step, and the
    loss of each step (all on the same batch).
    """
    config = bert_config(preset, vocab_size, "float32", remat)
    if dropout is not None:
        config.model.dropout_rate = config.model.attention_dropout_rate = dropout
    config.model.scan_layers = scan
    model = models.build(config.model)
    cfg = models.encoder_config(config.model)
    batch = random_batch(cfg, batch_size, seq_len, predictions)
    example = {k: v[:1] for k, v in batch.items()}
    step, tx = train_step(config, model)
    key = jax.random.key(0)

    state = jax.eval_shape(lambda k: nn.meta.unbox(state_init(model, tx, example)(k)), key)
    abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    clock = Clock()
    lowered = jax.jit(step, donate_argnums=(0,)).lower(state, abstract_batch, key)
    lower_s, lower_cpu_s = clock.lap()
    compiled = lowered.compile()
    compile_s, compile_cpu_s = clock.lap()
    memory = compiled.memory_analysis()
    row: dict[str, Any] = dict(
        preset=preset, batch_size=batch_size, seq_len=seq_len, dtype="float32", remat=remat, scan=scan,
        vocab_size=vocab_size, dropout=config.model.dropout_rate, device=jax.devices()[0].device_kind,
        lower_s=lower_s, lower_cpu_s=lower_cpu_s, compile_s=compile_s, compile_cpu_s=compile_cpu_s,
        argument_mib=memory.argument_size_in_bytes / MiB, temp_mib=memory.temp_size_in_bytes / MiB,
    )
    if steps:
        unscanned = models.build({**config.model.to_dict(), "scan_layers": False})
        params = jax.jit(lambda k: nn.meta.unbox(param_init(unscanned, example)(k)))(key)
        state = fresh_state({**params, "encoder": stack_layers(params["encoder"], cfg.num_layers)} if scan else params, tx)
        batch = jax.device_put(batch)
        laps, losses = [], []
        clock = Clock()
        for _ in range(1 + steps):
            state, metrics = compiled(state, batch, key)
            losses.append(float(metrics["loss"]))  # waits for the step
            laps.append(clock.lap())
        wall, cpu = np.median(laps[1:], axis=0)
        row.update(step_s=float(wall), step_cpu_s=float(cpu), losses=losses)
    return row


def measure_in_subprocess(spec: dict[str, Any]) -> dict[str, Any]:
    """`measure(**spec)` in a fresh Python process (no trace or executable cached from before; a
    persistent compilation cache, such as the test session's, is switched off, or `compile_s` would
    time loading an executable from disk)."""
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--one", json.dumps(spec)],
                          cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"measuring {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


COLUMNS = ["preset", "batch_size", "seq_len", "remat", "scan", "lower_s", "compile_s", "compile_cpu_s", "argument_mib",
           "temp_mib", "step_s", "step_cpu_s", "losses"]
FORMATS = {"lower_s": "{:.2f}", "compile_s": "{:.2f}", "compile_cpu_s": "{:.2f}", "argument_mib": "{:,.0f} MiB",
           "temp_mib": "{:,.0f} MiB", "step_s": "{:.3f}", "step_cpu_s": "{:.3f}",
           "losses": "{[0]:.6f}"}  # the table shows the first step's loss


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="base,large")
    p.add_argument("--remat", default="none,full", help="comma-separated model.remat policies")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20, help="max_predictions_per_seq (gathered MLM positions)")
    p.add_argument("--vocab_size", type=int, default=30522, help="BERT's uncased vocabulary size")
    p.add_argument("--step_presets", default="base", help="presets whose real steps are also timed (allocates them)")
    p.add_argument("--steps", type=int, default=1, help="timed real steps, after one warm-up step")
    p.add_argument("--dropout", type=float, default=None,
                   help="override the config's dropout rates (0: scanned and unscanned losses comparable)")
    p.add_argument("--out", default="runs/benchmarks")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a measure() spec as JSON: the child process's job
    args = p.parse_args(argv)

    if args.one:
        # A persistent compilation cache (JAX_COMPILATION_CACHE_DIR) would hide the compile being measured.
        jax.config.update("jax_enable_compilation_cache", False)
        print(json.dumps(measure(**json.loads(args.one))))
        return []
    grid = [(preset, remat) for preset in args.presets.split(",") for remat in args.remat.split(",")]
    for preset, remat in grid:  # an unknown preset or remat stops here with bertology's one-line UserError
        models.encoder_config(bert_config(preset, args.vocab_size, "float32", remat).model)
    rows = []
    for preset, remat in grid:
        for scan in (False, True):
            spec = dict(preset=preset, remat=remat, scan=scan, batch_size=args.batch_size, seq_len=args.seq_len,
                        predictions=args.predictions, vocab_size=args.vocab_size, dropout=args.dropout,
                        steps=args.steps if preset in args.step_presets.split(",") else 0)
            rows.append(measure_in_subprocess(spec))
            print(json.dumps(rows[-1]), flush=True)
    report.append(rows, pathlib.Path(args.out), "compile_time", COLUMNS, FORMATS)
    return rows


if __name__ == "__main__":
    main()
