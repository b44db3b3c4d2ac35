"""A Longformer from a RoBERTa run (Beltagy et al. 2020, §5 "Pretraining and Finetuning"; the
reference recipe is allenai/longformer's `convert_model_to_long.ipynb`):

- the position table grows from RoBERTa's 512 positions to `positions` (4,096) by copying the 512
  learned rows over and over (the rows before `position_offset`, the padding slots, stay), so
  attention starts with the local structure it learned and continued pretraining only adapts it;
- each layer's global projections (`query_global`, `key_global`, `value_global`) start as copies
  of its local ones;
- every layer gets a window of `window` (512 in the released models);
- from a fine-tuning run (a task's RoBERTa), the task's head comes along and the new run names
  the task, so fine-tuning it on long rows continues where the short rows left off (the
  long-range curriculum, configs/finetune/long_range.py).

On rows no longer than RoBERTa's positions, with a window at least the row and no global
tokens, the Longformer computes what the RoBERTa did (tests/test_longformer.py).

    python -m bertology.families.longformer.longify --from runs/roberta_base --to runs/longformer_base \\
        --positions 4096 --window 512
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

import jax
import numpy as np

from bertology import cli
from bertology.errors import UserError


def longify(params: dict, block: dict[str, Any], positions: int = 4096, window: int = 512) -> tuple[dict, dict]:
    """(params, model block) of the Longformer made from RoBERTa `params` with model block `block`."""
    if block.get("family") != "roberta":
        raise UserError(f"longify starts from a RoBERTa run, not model.family={block.get('family')!r}")
    offset = int(block.get("position_offset") or 0)
    params = jax.tree.map(np.asarray, params)
    encoder = dict(params["encoder"])
    embeddings = dict(encoder["embeddings"])
    table = embeddings["position"]["embedding"]
    learned = table[offset:]
    if positions < len(learned):
        raise UserError(f"--positions {positions} is fewer than the RoBERTa's {len(learned)}")
    repeats = -(-positions // len(learned))
    embeddings["position"] = {"embedding": np.concatenate([table[:offset], np.tile(learned, (repeats, 1))[:positions]])}
    encoder["embeddings"] = embeddings
    layers = int(block["num_layers"])
    for i in range(layers):
        attention = dict(encoder[f"attention_{i}"])
        for name in ("query", "key", "value"):
            attention[f"{name}_global"] = jax.tree.map(np.copy, attention[name])
        encoder[f"attention_{i}"] = attention
    new_block = {**block, "family": "longformer", "max_position_embeddings": offset + positions,
                 "attention_window": [window]}
    return {**params, "encoder": encoder}, new_block


def main(argv: list[str] | None = None) -> int:
    from bertology.interop.hf import run_tokenizer_files, write_run
    from bertology.train.checkpoint import load_params

    parser = argparse.ArgumentParser(prog="bertology.families.longformer.longify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, help="a RoBERTa run directory")
    parser.add_argument("--to", dest="target", required=True, help="the Longformer run directory to write (new)")
    parser.add_argument("--positions", type=int, default=4096, help="positions of the new table (4096)")
    parser.add_argument("--window", type=int, default=512, help="every layer's attention window (512)")
    args = parser.parse_args(argv)

    def work() -> None:
        params, run_config = load_params(pathlib.Path(args.source))
        new_params, block = longify(params, run_config["model"], args.positions, args.window)
        write_run(args.target, block, new_params, run_tokenizer_files((run_config.get("data") or {}).get("vocab")),
                  task=run_config.get("task"))
        print(f"wrote {args.target}: {block['num_layers']} layers, {args.positions} positions, window {args.window}")

    return cli.guarded(parser.prog, work)


if __name__ == "__main__":
    sys.exit(main())
