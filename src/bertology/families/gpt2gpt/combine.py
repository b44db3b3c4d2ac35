"""A GPT2GPT run from two GPT runs (Ramachandran, Liu & Le 2017, §2.1): the encoder is the source
LM's stack, the decoder the target LM's (token table, positions, self-attention, feed-forward,
final norm, and so the tied output softmax), and each decoder layer's cross-attention starts as
the core initialises it. Seq2seq fine-tuning then starts from the written run:

    python -m bertology.families.gpt2gpt.combine --source runs/gpt_source --target runs/gpt_target \\
        --to runs/gpt2gpt
    python -m bertology.finetune --config configs/gpt2gpt.py:embedded --config.init_checkpoint=runs/gpt2gpt ...

Pretraining's `init_checkpoint` takes one run, so the two-run start is this step, as Longformer's
`longify` is for its start from RoBERTa.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bertology import cli, models
from bertology.errors import UserError
from bertology.train.checkpoint import check_shapes


def block_of(source: dict[str, Any], target: dict[str, Any], causal_encoder: bool = True) -> dict[str, Any]:
    """The GPT2GPT model block of two GPT runs' blocks, which must be the same network."""
    for side, block in (("--source", source), ("--target", target)):
        if block.get("family") != "gpt":
            raise UserError(f"{side} must be a GPT run (configs/gpt.py), not model.family={block.get('family')!r}")
    differ = sorted(k for k in set(source) | set(target) if source.get(k) != target.get(k))
    if differ:
        raise UserError(f"the two GPT runs' model blocks differ in {differ}; pretrain both from one configs/gpt.py preset")
    return {**source, "family": "gpt2gpt", "causal_encoder": causal_encoder}


def fresh_params(block: dict[str, Any], seed: int = 0) -> dict:
    """A freshly initialised encoder-decoder of `block` (what supplies GPT2GPT's cross-attention,
    LSTM2LSTM's upper layers and attention)."""
    ids = np.ones((1, 4), np.int32)
    batch = {"input_ids": ids, "input_mask": ids, "decoder_input_ids": ids, "decoder_input_mask": ids}
    return nn.meta.unbox(jax.jit(models.build(block).init)(jax.random.key(seed), batch)["params"])


def combine(source: dict, target: dict, fresh: dict) -> dict:
    """GPT2GPT parameters: `source`'s GPT stack as the encoder, `target`'s as the decoder, the
    decoder's `cross_attention_*` (or a scanned stack's `layers/cross_attention`) from `fresh`."""
    encoder, decoder = source["decoder"], dict(target["decoder"])
    cross = {k: v for k, v in fresh["decoder"].items() if k.startswith("cross_attention_")}
    if "layers" in decoder:
        decoder["layers"] = {**decoder["layers"], "cross_attention": fresh["decoder"]["layers"]["cross_attention"]}
    params = {"encoder": encoder, "decoder": {**decoder, **cross}}
    check_shapes(params, fresh, pathlib.Path("the two GPT runs"))
    return params


def arguments(prog: str, doc: str | None, lm: str, made: str, fresh: str) -> argparse.ArgumentParser:
    """A combine step's arguments (GPT2GPT's, LSTM2LSTM's): the two `lm` runs, the `made` run to
    write and the seed of its `fresh` parameters; `doc`'s first paragraph describes the step."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    parser.add_argument("--source", required=True, help=f"the source-side {lm} run (the encoder)")
    parser.add_argument("--target", required=True, help=f"the target-side {lm} run (the decoder)")
    parser.add_argument("--to", required=True, help=f"the {made} run directory to write (new)")
    parser.add_argument("--seed", type=int, default=0, help=f"seed of the fresh {fresh}")
    return parser


def main(argv: list[str] | None = None) -> int:
    from bertology.interop.hf import run_tokenizer_files, write_run
    from bertology.train.checkpoint import load_params

    parser = arguments("bertology.families.gpt2gpt.combine", __doc__, "GPT", "GPT2GPT", "cross-attention")
    parser.add_argument("--bidirectional_encoder", action="store_true", help="drop the encoder's causal mask")
    args = parser.parse_args(argv)

    def work() -> None:
        (src, src_config), (tgt, tgt_config) = load_params(args.source), load_params(args.target)
        vocab = src_config["data"].get("vocab")
        if vocab != tgt_config["data"].get("vocab"):
            raise UserError("the two GPT runs have different data.vocab; seq2seq fine-tuning reads one tokenizer")
        block = block_of(src_config["model"], tgt_config["model"], not args.bidirectional_encoder)
        params = combine(src, tgt, fresh_params(block, args.seed))
        write_run(args.to, block, params, run_tokenizer_files(vocab))
        print(f"wrote {args.to}: encoder from {args.source}, decoder from {args.target}, cross-attention fresh")

    return cli.guarded(parser.prog, work)


if __name__ == "__main__":
    sys.exit(main())
