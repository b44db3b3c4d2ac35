"""Pretrain a BERT-family model.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/tiny [--config.total_steps=200]

Rerunning with the same --workdir resumes from its latest checkpoint.
"""

from __future__ import annotations

import sys

from absl import flags

from bertology import cli


def _define(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", "runs/default", "Checkpoints, metrics.jsonl and TensorBoard files go here.", flag_values=fv)


def _main(fv: flags.FlagValues) -> None:
    from bertology.train.loop import train

    summary = train(fv.config, fv.workdir)
    history = summary["history"]
    if history:
        print(f"done: step {summary['step']}, loss {history[0]['loss']:.4f} (step {history[0]['step']}) -> "
              f"{history[-1]['loss']:.4f} (step {history[-1]['step']}); metrics in {fv.workdir}/metrics.jsonl")


if __name__ == "__main__":
    sys.exit(cli.run("bertology.pretrain", _main, _define))
