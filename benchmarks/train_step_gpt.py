"""Train-step throughput of GPT-2 causal-LM pretraining, ours against Hugging Face Flax, in one process.

    python -m benchmarks.train_step_gpt --batch_size 1 --seq_len 1024 [--peak_flops 989e12]

The GPT version of `benchmarks.train_step`, with its timing and reporting: our `gpt` family
built from configs/gpt.py's block (GPT-2 124M: pre-LN, 12L/768/12, vocabulary 50257) with the
`causal_lm` objective, against `FlaxGPT2LMHeadModel` from the equivalent GPT2Config with the
loss as HF users write it (`benchmarks.reference`); the same random batch, dropout on, the same
optax AdamW step. Appends to --out/train_step_gpt.jsonl and --out/train_step_gpt.md.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

from benchmarks.train_step import jitted_step, measure, parse_args, recipe_config
from bertology.errors import UserError


def causal_batch(vocab_size: int, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token rows as the `causal` transform gives them, one document filling each row:
    the target of position i is token i + 1 of the row, and the last position has no target
    (weight 0), so the loss is exactly HF's shifted cross-entropy over the same rows."""
    ids = np.random.default_rng(seed).integers(0, vocab_size, (batch, length), dtype=np.int32)
    weights = np.ones((batch, length), np.float32)
    weights[:, -1] = 0.0
    return {
        "input_ids": ids,
        "input_mask": np.ones((batch, length), np.int32),
        "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy(),
        "packing_ids": np.ones((batch, length), np.int32),
        "targets": np.concatenate([ids[:, 1:], np.zeros((batch, 1), np.int32)], axis=1),
        "target_weights": weights,
    }


def theirs(config: Any) -> tuple[Callable, dict]:
    from benchmarks.reference import hf_causal_lm_loss, hf_gpt2_model

    model = hf_gpt2_model(dict(config.model))
    return jitted_step(model, hf_causal_lm_loss, model.params, config)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2", help="a preset of configs/gpt.py")
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--vocab_size", type=int, default=50257, help="GPT-2's byte-level BPE vocabulary size")
    args = parse_args(p, argv)

    config = recipe_config("gpt", args.preset, args.vocab_size, args.dtype, args.remat)
    if args.seq_len > config.model.max_position_embeddings:
        raise UserError(f"--seq_len {args.seq_len} exceeds preset {args.preset}'s "
                        f"{config.model.max_position_embeddings} positions; pass at most that")
    config.data.max_seq_length = args.seq_len
    batch = causal_batch(args.vocab_size, args.batch_size, args.seq_len)
    return measure(args, config, batch, theirs, "train_step_gpt")


if __name__ == "__main__":
    main()
