"""Long encoders started from a RoBERTa run, as both long-document papers start theirs: Longformer
(Beltagy et al. 2020, §5, `bertology.families.longformer.longify`) and BigBird (Zaheer et al.
2020, App. E: warm-started from RoBERTa's checkpoint, `bertology.families.bigbird.warm_start`).
What they share lives here: the position table copied out to the long row, and the command that
reads a RoBERTa run and writes the long one.

The table grows by repeating the learned rows (those past `position_offset`, RoBERTa's padding
slots) over and over, so position p of the long row starts as position p mod 512 of the short
one: on rows no longer than RoBERTa's, the long model's positions are RoBERTa's, and attention
starts with the local structure it learned.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any, Callable

import jax
import numpy as np

from bertology import cli
from bertology.errors import UserError

# (RoBERTa params, its model block, the parsed arguments) -> (params, model block) of the long model
Convert = Callable[[dict, dict[str, Any], argparse.Namespace], tuple[dict, dict[str, Any]]]


def check_source(block: dict[str, Any], family: str, tool: str) -> None:
    """Refuse a run whose model block is not of `family` (the one `tool` converts), in one line."""
    if block.get("family") != family:
        raise UserError(f"{tool} starts from a {family} run, not model.family={block.get('family')!r}")


def repeat_positions(params: dict, block: dict[str, Any], positions: int, keep_offset: bool) -> dict:
    """`params` (a RoBERTa run's, numpy) with the position table grown to `positions` rows past the
    offset by repeating the learned rows; with `keep_offset` the padding rows before them stay
    (Longformer keeps RoBERTa's offset of 2), else they go (BigBird's positions start at 0)."""
    offset = int(block.get("position_offset") or 0)
    encoder = dict(params["encoder"])
    embeddings = dict(encoder["embeddings"])
    table = np.asarray(embeddings["position"]["embedding"])
    learned = table[offset:]
    if positions < len(learned):
        raise UserError(f"--positions {positions} is fewer than the RoBERTa's {len(learned)}")
    repeated = np.tile(learned, (-(-positions // len(learned)), 1))[:positions]
    embeddings["position"] = {"embedding": np.concatenate([table[:offset], repeated]) if keep_offset else repeated}
    encoder["embeddings"] = embeddings
    return {**params, "encoder": encoder}


def main(prog: str, description: str, convert: Convert, options: Callable[[argparse.ArgumentParser], None],
         argv: list[str] | None = None) -> int:
    """The command `prog`: --from a RoBERTa run, --to a new run directory, --positions, and the
    family's `options`; writes `convert`'s params and block with the RoBERTa's tokenizer. From a
    fine-tuning run, its head comes along and the new run names its task, so fine-tuning that
    task on long rows continues where the short rows left off."""
    from bertology.interop.hf import run_tokenizer_files, write_run
    from bertology.train.checkpoint import load_params

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--from", dest="source", required=True, help="a RoBERTa run directory")
    parser.add_argument("--to", dest="target", required=True, help="the run directory to write (new)")
    parser.add_argument("--positions", type=int, default=4096, help="positions of the new table (4096)")
    options(parser)
    args = parser.parse_args(argv)

    def work() -> None:
        params, run_config = load_params(pathlib.Path(args.source))
        new_params, block = convert(jax.tree.map(np.asarray, params), run_config["model"], args)
        write_run(args.target, block, new_params, run_tokenizer_files((run_config.get("data") or {}).get("vocab")),
                  task=run_config.get("task"))
        print(f"wrote {args.target}: a {block['family']} of {block['num_layers']} layers, {args.positions} positions")

    return cli.guarded(prog, work)
