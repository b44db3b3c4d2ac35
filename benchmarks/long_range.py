"""Accuracy on the long-range task (`bertology.tasks.long_range`) of a 512-token encoder against
four 4,096-token ones, each fine-tuned in configs/finetune/long_range.py's two stages: the skill
on 128-token documents from scratch (`<model>_short`), then the 4,096-token documents from that
run (the Longformer and the BigBird from the short RoBERTa, as their papers start theirs). The
key sentence always lies past the first 512 tokens, so the truncated model should sit at chance
(1/K) and a model that reaches the whole row (Longformer's global [CLS], BigBird's global first
block, ModernBERT's global layers, the Reformer's hashed buckets) above it.

    python -m benchmarks.long_range --workdir runs/long_range           # the full table (CPU: ~30 minutes)
    python -m benchmarks.long_range --workdir /tmp/lr --smoke           # tiny documents, two steps: the plumbing (~3 min)

Writes `long_range.json` and `long_range.md` (model, max length, its first stage's accuracy on
short documents, validation accuracy on the long ones, chance) in the workdir; a rerun in the
same workdir reuses the stages already done. The smoke run's accuracies mean nothing (a few steps
on 16 documents); it checks that every stage builds, trains and is scored on the task.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

from bertology import sweep
from bertology.families.bigbird import warm_start
from bertology.families.longformer import longify
from bertology.train.finetune import finetune

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "finetune" / "long_range.py"
PRESETS = ("roberta_512", "longformer_4096", "bigbird_4096", "modernbert_4096", "reformer_4096")
FIRST_STAGE = {"roberta_512": "roberta_short", "longformer_4096": "roberta_short", "bigbird_4096": "roberta_short",
               "modernbert_4096": "modernbert_short", "reformer_4096": "reformer_short"}
# Smoke: 128-token documents whose key lies after 32 words (the truncated model reads 32 tokens); the
# short stage's 64-token documents put it after 16.
SMOKE = dict(long_range_tokens=128, long_range_prefix=32, long_range_train=16, long_range_eval=8)
SMOKE_SHORT = dict(SMOKE, long_range_tokens=64, long_range_prefix=16)


def preset_config(preset: str, smoke: bool) -> Any:
    """The preset's fine-tuning config; with `smoke`, tiny documents and two steps."""
    c = sweep.load_config(CONFIG, preset)
    if smoke:
        short = preset.endswith("_short")
        truncated = c.data.max_seq_length < c.data.long_range_tokens
        c.data.update(SMOKE_SHORT if short else SMOKE)
        c.data.max_seq_length = c.data.long_range_prefix if truncated else c.data.long_range_tokens
        c.total_steps, c.batch_size, c.eval_batch_size, c.log_every = 2, 4, 8, 1
    return c


def stage(c: Any, workdir: pathlib.Path, start: pathlib.Path | None = None) -> dict[str, Any]:
    """Fine-tune config `c` in `workdir` (from run `start`, if given); the finished run's results if
    it is there already."""
    done = workdir / "results.json"
    if done.exists():
        return json.loads(done.read_text())
    if start is not None:
        c.init_checkpoint = str(start)
    return finetune(c, workdir)


def from_roberta(c: Any, roberta: pathlib.Path, to: pathlib.Path) -> None:
    """Write at `to` the long model of config `c` (a Longformer or a BigBird: its positions and
    attention pattern) made from the RoBERTa run `roberta`, as each paper starts its own."""
    m, paths = c.model, ["--from", str(roberta), "--to", str(to)]
    if m.family == "longformer":
        longify.main([*paths, "--positions", str(m.max_position_embeddings - m.position_offset),
                      "--window", str(m.attention_window[0])])
    else:
        warm_start.main([*paths, "--positions", str(m.max_position_embeddings), "--block_size", str(m.sparse_block_size),
                         "--random_blocks", str(m.num_random_blocks)])


def run(workdir: str | pathlib.Path, smoke: bool = False, presets: tuple[str, ...] = PRESETS) -> list[dict[str, Any]]:
    """Both stages of each preset under `workdir` (`<first stage>/`, `<preset>/`); returns (and
    writes) the table's rows."""
    workdir = pathlib.Path(workdir)
    rows = []
    for preset in presets:
        first = FIRST_STAGE[preset]
        short = stage(preset_config(first, smoke), workdir / first)
        c = preset_config(preset, smoke)
        start = workdir / first
        if c.model.family in ("longformer", "bigbird"):  # started from the short RoBERTa
            start = workdir / f"{c.model.family}_init"
            if not start.exists():
                from_roberta(c, workdir / first, start)
        results = stage(c, workdir / preset, start)
        rows.append({"model": preset, "family": c.model.family, "max_length": c.data.max_seq_length,
                     "short_accuracy": short["scores"]["accuracy"], "accuracy": results["scores"]["accuracy"],
                     "chance": 100 / c.data.long_range_classes, "steps": [short["steps"], results["steps"]]})
    table = ["| model | max length | stage 1: short documents | stage 2: long documents | chance | steps |",
             "|---|---|---|---|---|---|"]
    table += [f"| {r['model']} | {r['max_length']} | {r['short_accuracy']:.1f} | {r['accuracy']:.1f} | {r['chance']:.1f} "
              f"| {r['steps'][0]} + {r['steps'][1]} |" for r in rows]
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "long_range.json").write_text(json.dumps(rows, indent=1))
    (workdir / "long_range.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/long_range")
    parser.add_argument("--smoke", action="store_true", help="tiny documents and two steps per stage")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated second-stage presets to run")
    args = parser.parse_args(argv)
    run(args.workdir, args.smoke, tuple(args.presets.split(",")))


if __name__ == "__main__":
    main()
