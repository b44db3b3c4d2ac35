"""Train-step throughput of T5 and BART, ours against Hugging Face Flax, in one process.

    python -m benchmarks.train_step_seq2seq --recipe t5 --preset small --batch_size 8 --seq_len 512
    python -m benchmarks.train_step_seq2seq --recipe bart --preset base --batch_size 8 --seq_len 512

The encoder-decoder version of `benchmarks.train_step`, with its timing and reporting: our `t5`
or `bart` family from configs/<recipe>.py's block with the `seq2seq` objective, against
`FlaxT5ForConditionalGeneration` / `FlaxBartForConditionalGeneration` random-initialised from the
config an export of our run would write (`benchmarks.reference`), fed the same random batch
(source, decoder input, targets, masks), with the same loss on its logits, dropout on (for T5
also on the feed-forward hidden units, as T5 and HF's T5 do), and the same optax AdamW step. Tokens/s counts source tokens, as the FLOPs per token do. Appends to
--out/train_step_seq2seq.jsonl and --out/train_step_seq2seq.md.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

from benchmarks.train_step import jitted_step, measure, parse_args, recipe_config
from bertology.errors import UserError

RECIPES = {"t5": "small", "bart": "base"}  # recipe: the preset benchmarked by default
VOCAB = {"t5": 32128, "bart": 50265}  # the released checkpoints' tables (T5's padded 32,100; GPT-2's BPE + 3)
START = {"t5": 0, "bart": 2}  # decoder_start_token_id: T5's pad, BART's EOS


def seq2seq_batch(vocab_size: int, batch: int, source: int, target: int, start_id: int,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Random source and target rows as the seq2seq transforms give them: the decoder input is
    the target shifted right behind `start_id`; every fourth row is padded to half its length in
    both the source and the target (weight 0 there), so both models must honour the masks."""
    rng = np.random.default_rng(seed)
    short = (np.arange(batch) % 4 == 3)[:, None]
    input_mask = ~(short & (np.arange(source) >= source // 2))
    target_mask = ~(short & (np.arange(target) >= target // 2))
    ids = np.where(input_mask, rng.integers(3, vocab_size, (batch, source)), 0)
    targets = np.where(target_mask, rng.integers(3, vocab_size, (batch, target)), 0)
    decoder = np.concatenate([np.full((batch, 1), start_id), targets[:, :-1]], axis=1)
    return {
        "input_ids": ids.astype(np.int32),
        "input_mask": input_mask.astype(np.int32),
        "decoder_input_ids": np.where(target_mask, decoder, 0).astype(np.int32),
        "decoder_input_mask": target_mask.astype(np.int32),
        "targets": targets.astype(np.int32),
        "target_weights": target_mask.astype(np.float32),
    }


def theirs(config: Any) -> tuple[Callable, dict]:
    from benchmarks.reference import hf_seq2seq_loss, hf_seq2seq_model

    model, params = hf_seq2seq_model(dict(config.model))
    return jitted_step(model, hf_seq2seq_loss, params, config)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="t5", choices=tuple(RECIPES))
    p.add_argument("--preset", default=None, help="a preset of configs/<recipe>.py (default: t5 small, bart base)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=512, help="source tokens per row")
    p.add_argument("--target_len", type=int, default=None, help="target tokens per row (default: the recipe's)")
    p.add_argument("--vocab_size", type=int, default=None, help="default: the released checkpoints' (32128, 50265)")
    args = parse_args(p, argv)

    args.preset = args.preset or RECIPES[args.recipe]
    args.vocab_size = args.vocab_size or VOCAB[args.recipe]
    config = recipe_config(args.recipe, args.preset, args.vocab_size, args.dtype, args.remat)
    positions = config.model.get("max_position_embeddings", 0) - config.model.get("position_offset", 0)
    target_len = args.target_len or round(args.seq_len * config.data.max_target_length / config.data.max_seq_length)
    if config.model.get("positions", "absolute") == "absolute" and max(args.seq_len, target_len) > positions:
        raise UserError(f"--seq_len {args.seq_len} / target {target_len} exceeds preset {args.preset}'s {positions} "
                        "positions; pass at most that")
    config.data.max_seq_length, config.data.max_target_length = args.seq_len, target_len
    batch = seq2seq_batch(args.vocab_size, args.batch_size, args.seq_len, target_len, START[args.recipe])
    args.preset = f"{args.recipe}:{args.preset}"
    return measure(args, config, batch, theirs, "train_step_seq2seq", target_len=target_len)


if __name__ == "__main__":
    main()
