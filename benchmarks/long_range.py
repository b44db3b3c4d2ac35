"""Accuracy on the long-range task (`bertology.tasks.long_range`) of a 512-token encoder against
three 4,096-token ones, each a preset of configs/finetune/long_range.py fine-tuned from scratch:
the key sentence always lies past the first 512 tokens, so the truncated model should sit at
chance (1/K) and a model that reaches the whole row (Longformer's global [CLS], ModernBERT's
global layers, the Reformer's hashed buckets) above it.

    python -m benchmarks.long_range --workdir runs/long_range           # the full table (CPU: tens of minutes)
    python -m benchmarks.long_range --workdir /tmp/lr --smoke           # tiny documents, two steps: the plumbing (~2 min)

Writes `long_range.json` and `long_range.md` (model, max length, validation accuracy, chance) in
the workdir. The smoke run's accuracies mean nothing (a few steps on 16 documents); it checks
that every preset builds, trains and is scored on the task.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

from bertology import sweep
from bertology.train.finetune import finetune

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "finetune" / "long_range.py"
PRESETS = ("roberta_512", "longformer_4096", "modernbert_4096", "reformer_4096")
# Smoke: 128-token documents whose key lies after 32 words; the truncated model reads 32 tokens.
SMOKE = dict(long_range_tokens=128, long_range_prefix=32, long_range_train=16, long_range_eval=8)


def preset_config(preset: str, smoke: bool) -> Any:
    """The preset's fine-tuning config; with `smoke`, tiny documents and two steps."""
    c = sweep.load_config(CONFIG, preset)
    if smoke:
        truncated = c.data.max_seq_length < c.data.long_range_tokens
        c.data.update(SMOKE)
        c.data.max_seq_length = SMOKE["long_range_prefix"] if truncated else SMOKE["long_range_tokens"]
        c.total_steps, c.batch_size, c.eval_batch_size, c.log_every = 2, 4, 8, 1
    return c


def run(workdir: str | pathlib.Path, smoke: bool = False, presets: tuple[str, ...] = PRESETS) -> list[dict[str, Any]]:
    """Fine-tune each preset in `workdir/<preset>` and return (and write) the table's rows."""
    workdir = pathlib.Path(workdir)
    rows = []
    for preset in presets:
        c = preset_config(preset, smoke)
        results = finetune(c, workdir / preset)
        rows.append({"model": preset, "family": c.model.family, "max_length": c.data.max_seq_length,
                     "accuracy": results["scores"]["accuracy"], "chance": 100 / c.data.long_range_classes,
                     "steps": results["steps"], "seconds": round(results["seconds"], 1)})
    table = ["| model | max length | validation accuracy | chance | steps |", "|---|---|---|---|---|"]
    table += [f"| {r['model']} | {r['max_length']} | {r['accuracy']:.1f} | {r['chance']:.1f} | {r['steps']} |"
              for r in rows]
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "long_range.json").write_text(json.dumps(rows, indent=1))
    (workdir / "long_range.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/long_range")
    parser.add_argument("--smoke", action="store_true", help="tiny documents and two steps per preset")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets to run")
    args = parser.parse_args(argv)
    run(args.workdir, args.smoke, tuple(args.presets.split(",")))


if __name__ == "__main__":
    main()
