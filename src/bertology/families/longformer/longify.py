"""A Longformer from a RoBERTa run (Beltagy et al. 2020, §5 "Pretraining and Finetuning"; the
reference recipe is allenai/longformer's `convert_model_to_long.ipynb`):

- the position table grows from RoBERTa's 512 positions to `positions` (4,096) by copying the 512
  learned rows over and over (`bertology.models.warm_start`; the rows before `position_offset`,
  the padding slots, stay), so attention starts with the local structure it learned and
  continued pretraining only adapts it;
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
import sys
from typing import Any

import jax
import numpy as np

from bertology.models import warm_start


def longify(params: dict, block: dict[str, Any], positions: int = 4096, window: int = 512) -> tuple[dict, dict]:
    """(params, model block) of the Longformer made from RoBERTa `params` (numpy) with model block `block`."""
    warm_start.check_source(block, "roberta", "longify")
    params = warm_start.repeat_positions(params, block, positions, keep_offset=True)
    encoder = dict(params["encoder"])
    for i in range(int(block["num_layers"])):
        attention = dict(encoder[f"attention_{i}"])
        for name in ("query", "key", "value"):
            attention[f"{name}_global"] = jax.tree.map(np.copy, attention[name])
        encoder[f"attention_{i}"] = attention
    offset = int(block.get("position_offset") or 0)
    new_block = {**block, "family": "longformer", "max_position_embeddings": offset + positions,
                 "attention_window": [window]}
    return {**params, "encoder": encoder}, new_block


def main(argv: list[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--window", type=int, default=512, help="every layer's attention window (512)")

    return warm_start.main("bertology.families.longformer.longify", __doc__.split("\n\n")[0],
                           lambda params, block, args: longify(params, block, args.positions, args.window),
                           options, argv)


if __name__ == "__main__":
    sys.exit(main())
