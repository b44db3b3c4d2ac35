"""XLNet-base-shaped training step (forward + backward, memory carried), ours against transformers'
PyTorch `XLNetLMHeadModel` in one process, and what the memory costs in compiled memory.

    python -m benchmarks.train_step_xlnet --batch_size 2 --steps 2 [--memory_cost]

The shapes are the reference's base pretraining: sequence 512, reuse_len 256, mem_len 384,
num_predict 85, vocabulary 32000, dropout 0.1; both models are random, both get the same batch
(85 targets with every other token barred from seeing them), and both carry their memory from
step to step. No optimizer on either side: the comparison is the network. Appends to
--out/train_step_xlnet.jsonl and .md.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from benchmarks import report
from bertology import models
from bertology.families.xlnet import objective

LENGTH, REUSE, MEMORY, PREDICT, VOCAB, WIDTH, LAYERS = 512, 256, 384, 85, 32000, 768, 12


def batch_of(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids; 85 target positions that no position may attend to (so none sees its answer)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (rows, LENGTH)).astype(np.int32)
    targets = np.sort(rng.choice(LENGTH, PREDICT, replace=False))
    perm = np.zeros((rows, LENGTH, LENGTH), np.float32)
    perm[:, :, targets] = 1
    mapping = np.zeros((rows, PREDICT, LENGTH), np.float32)
    mapping[:, np.arange(PREDICT), targets] = 1
    return dict(input_ids=ids, input_mask=np.ones((rows, LENGTH), np.int32), segment_ids=np.zeros((rows, LENGTH), np.int32),
                perm_mask=perm, target_mapping=mapping, targets=ids[:, targets],
                target_weights=np.ones((rows, PREDICT), np.float32))


def block(mem_len: int) -> dict[str, Any]:
    return dict(family="xlnet", vocab_size=VOCAB, hidden_size=WIDTH, num_layers=LAYERS, num_heads=12,
                intermediate_size=3072, positions="none", type_vocab_size=0, embedding_norm=False,
                activation="gelu_tanh", pooler=False, dropout_rate=0.1, attention_dropout_rate=0.1,
                activation_dropout_rate=0.1, mem_len=mem_len, reuse_len=REUSE)


def compiled_step(mem_len: int, batch: dict[str, np.ndarray]) -> tuple[Any, Any, dict]:
    """Our jitted (params, batch, key) -> (loss, grads, carry), compiled, with params and the batch."""
    model = models.build(block(mem_len))
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), {"input_ids": batch["input_ids"]}))["params"]
    carry = models.family("xlnet").initial_carry(block(mem_len), len(batch["input_ids"]))
    batch = dict(batch, carry=carry) if carry is not None else batch

    def step(p, b, key):
        def loss(p):
            terms = objective.loss(p, b, key, model)
            return terms.loss_value(), terms.carry
        (value, carry), grads = jax.value_and_grad(loss, has_aux=True)(p)
        return value, grads, carry

    return jax.jit(step).lower(params, batch, jax.random.key(1)).compile(), params, batch


def ours_seconds(batch: dict[str, np.ndarray], steps: int) -> float:
    step, params, b = compiled_step(MEMORY, batch)
    jax.block_until_ready(step(params, b, jax.random.key(0)))
    start = time.perf_counter()
    for i in range(steps):
        out = step(params, b, jax.random.key(i + 1))
        b = dict(b, carry=out[2])
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps


def theirs_seconds(batch: dict[str, np.ndarray], steps: int) -> float:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=WIDTH, n_layer=LAYERS, n_head=12, d_inner=3072,
                                      ff_activation="gelu_new", mem_len=MEMORY, reuse_len=REUSE, dropout=0.1,
                                      use_mems_train=True)
    model = transformers.XLNetLMHeadModel(config).train()
    t = {k: torch.tensor(np.ascontiguousarray(v)) for k, v in batch.items()}
    rows = len(batch["input_ids"])

    def step(mems):
        out = model(input_ids=t["input_ids"].long(), perm_mask=t["perm_mask"], target_mapping=t["target_mapping"],
                    token_type_ids=t["segment_ids"].long(), mems=mems, labels=t["targets"].long(), use_mems=True)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        return [m.detach() for m in out.mems]

    mems = step([torch.zeros(MEMORY, rows, WIDTH) for _ in range(LAYERS)])
    start = time.perf_counter()
    for _ in range(steps):
        mems = step(mems)
    return (time.perf_counter() - start) / steps


def mib(step: Any) -> float:
    m = step.memory_analysis()
    return (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes) / 2**20


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--memory_cost", action="store_true", help="also compile without memory and compare")
    p.add_argument("--out", default="runs/benchmarks")
    args = p.parse_args(argv)
    batch = batch_of(args.batch_size)
    tokens = args.batch_size * LENGTH
    ours, theirs = ours_seconds(batch, args.steps), theirs_seconds(batch, args.steps)
    row = {"batch_size": args.batch_size, "seq_len": LENGTH, "mem_len": MEMORY, "tokens_per_s": tokens / ours,
           "torch_tokens_per_s": tokens / theirs, "ratio": theirs / ours}
    if args.memory_cost:
        row["compiled_mib"] = mib(compiled_step(MEMORY, batch)[0])
        row["compiled_mib_no_memory"] = mib(compiled_step(0, batch)[0])
    formats = {"tokens_per_s": "{:.1f}", "torch_tokens_per_s": "{:.1f}", "ratio": "{:.2f}×",
               "compiled_mib": "{:,.0f}", "compiled_mib_no_memory": "{:,.0f}"}
    report.append([row], pathlib.Path(args.out), "train_step_xlnet", list(row), formats)
    return row


if __name__ == "__main__":
    main()
