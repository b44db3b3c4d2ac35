"""A BigBird from a RoBERTa run, as the paper starts its own (Zaheer et al. 2020, App. E: the
released bigbird-roberta models' MLM pretraining was warm-started from RoBERTa's checkpoint):

- the parameters are RoBERTa's as they are (BigBird's network is RoBERTa's, `bertology.families.bigbird`:
  only its attention pattern differs, and the pattern has no weights of its own);
- the position table grows from RoBERTa's 512 learned rows to `positions` (4,096) by repeating
  them (`bertology.models.warm_start`), and loses RoBERTa's two padding rows: BigBird's
  positions start at 0, so position p starts as RoBERTa's p mod 512;
- the attention is block-sparse, blocks of `block_size` tokens with `random_blocks` random blocks
  (64 and 3 in the released models);
- from a fine-tuning run (a task's RoBERTa), the task's head comes along and the new run names
  the task (the long-range curriculum, configs/finetune/long_range.py).

On rows too short for the block-sparse pattern (BigBird attends fully there), the BigBird
computes what the RoBERTa did (tests/test_bigbird.py).

    python -m bertology.families.bigbird.warm_start --from runs/roberta_base --to runs/bigbird_base \\
        --positions 4096 --block_size 64 --random_blocks 3
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bertology.models import warm_start


def from_roberta(params: dict, block: dict[str, Any], positions: int = 4096, block_size: int = 64,
                 random_blocks: int = 3) -> tuple[dict, dict]:
    """(params, model block) of the BigBird made from RoBERTa `params` (numpy) with model block `block`."""
    warm_start.check_source(block, "roberta", "warm_start")
    new_block = {**block, "family": "bigbird", "position_offset": 0, "max_position_embeddings": positions,
                 "sparse_block_size": block_size, "num_random_blocks": random_blocks}
    return warm_start.repeat_positions(params, block, positions, keep_offset=False), new_block


def main(argv: list[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--block_size", type=int, default=64, help="tokens per attention block (64)")
        parser.add_argument("--random_blocks", type=int, default=3, help="random blocks each block attends (3)")

    return warm_start.main("bertology.families.bigbird.warm_start", __doc__.split("\n\n")[0],
                           lambda params, block, args: from_roberta(params, block, args.positions, args.block_size,
                                                                    args.random_blocks), options, argv)


if __name__ == "__main__":
    sys.exit(main())
