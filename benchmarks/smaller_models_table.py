"""The table of `benchmarks/smaller_models.sh`: accuracy, parameters, weight bytes and inference
examples/s of each fine-tuned model (batch 64×64 on this machine; the int8 row runs int8 × int8
→ int32 matmuls on its exported int8 weights).

    python -m benchmarks.smaller_models_table runs/smaller_models
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import jax
import ml_collections
import numpy as np

from bertology import tasks
from bertology.models.tasks import TaskModel
from bertology.train import quantize
from bertology.train.checkpoint import load_params
from bertology.train.finetune import _encoder

ROWS = (("teacher (BERT tiny, 2L/128)", "ft_teacher", False), ("DistilBERT student", "ft_distil", False),
        ("TinyBERT student, prediction-distilled", "ft_tinybert", False),
        ("Q8BERT (int8 QAT; int8 inference)", "ft_q8", True), ("teacher pruned 50% (magnitude)", "ft_prune50", False),
        ("teacher pruned 90% (magnitude)", "ft_prune90", False))


def examples_per_s(f, params, batch, repeats: int = 10) -> float:
    jax.block_until_ready(f(params, batch))
    best = min(_timed(f, params, batch) for _ in range(repeats))
    return len(batch["input_ids"]) / best


def _timed(f, params, batch) -> float:
    t = time.perf_counter()
    jax.block_until_ready(f(params, batch))
    return time.perf_counter() - t


def main(root: str) -> None:
    runs = pathlib.Path(root)
    rng = np.random.default_rng(0)
    task = tasks.get("embedded")
    print("| model | accuracy | parameters (nonzero) | weight bytes | inference examples/s |")
    print("|---|---|---|---|---|")
    for name, run, int8 in ROWS:
        scores = json.loads((runs / run / "results.json").read_text())["scores"]
        params, conf = load_params(runs / run)
        cfg = _encoder(ml_collections.ConfigDict(conf))[0]
        batch = {"input_ids": rng.integers(1, cfg.vocab_size, (64, 64)).astype(np.int32),
                 "input_mask": np.ones((64, 64), np.int32), "segment_ids": np.zeros((64, 64), np.int32)}
        if int8:
            model = quantize.QuantizedTaskModel(cfg, "classification", len(task.labels), int8=True)
            params = quantize.int8_params(params)
        else:
            model = TaskModel(cfg, "classification", len(task.labels))
        f = jax.jit(lambda p, b: model.apply({"params": p}, b)["logits"])
        n = sum(x.size for x in jax.tree.leaves(params))
        nonzero = sum(int((np.asarray(x) != 0).sum()) for x in jax.tree.leaves(params))
        print(f"| {name} | {scores['accuracy']:.1f} | {n / 1e6:.3f}M ({nonzero / 1e6:.3f}M) | "
              f"{quantize.nbytes(params) / 2**20:.2f} MiB | {examples_per_s(f, params, batch):.0f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/smaller_models")
