"""ELMo's biLM, ours (`jax.lax.scan`) against a PyTorch biLM of the same shape, in one process.

    python -m benchmarks.lstm --preset tiny [--batch_size 16] [--steps 5]

Both sides are the stateful pretraining step of configs/elmo.py's preset: the char CNN over 50
character ids per word (one convolution per filter, max-pooled, highways, projection), a forward
and a backward stack of LSTMs with projections (residual between layers) starting from carried
states, and the softmax over the word vocabulary shared by both directions (0.5 · (forward +
backward) cross-entropy, dropout on); ours is the jitted train step with AdamW, theirs
`torch.nn.Conv1d` + `torch.nn.LSTM(proj_size=...)` + `torch.optim.AdamW`. PyTorch's LSTM has no
cell or projection clipping, so that side skips it (elementwise, a negligible cost). Also timed:
the forward pass alone (ours jitted, theirs under `torch.no_grad`). Reports the tokens (words)/s
of each and the ratios, ours over theirs, of wall time and of this process's CPU time
(`benchmarks.train_step.throughput`); rows go to --out/lstm.jsonl and --out/lstm.md. PyTorch
runs on --torch_threads (1) threads: see that flag.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks import report
from benchmarks.train_step import jitted_step, recipe_config, throughput
from bertology import models, objectives
from bertology.families.elmo import model as elmo
from bertology.train.step import param_init

WORDS = {"tiny": 4096, "small": 16384, "original": 32768}  # configs/elmo.py's word vocabularies


def random_batch(cfg: elmo.ElmoConfig, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A stateful bilm batch of the right shapes (values do not affect speed), with its carry."""
    rng = np.random.default_rng(seed)
    chars = lambda: rng.integers(1, cfg.n_characters, (batch, length, cfg.max_characters_per_token), dtype=np.int32)  # noqa: E731
    ids = lambda: rng.integers(0, cfg.vocab_size, (batch, length), dtype=np.int32)  # noqa: E731
    ones = np.ones((batch, length), np.float32)
    return {"input_ids": ids(), "char_ids": chars(), "backward_char_ids": chars(), "targets": ids(),
            "target_weights": ones, "backward_targets": ids(), "backward_target_weights": ones}


def ours(config: Any, batch: dict[str, np.ndarray]) -> tuple[tuple[Callable, Any], tuple[Callable, Any]]:
    """(train step, state) and (forward, params) of our biLM, both jitted."""
    model = models.build(config.model)
    carry = elmo.initial_carry(config.model, batch["input_ids"].shape[0])
    example = {**{k: v[:1] for k, v in batch.items()}, "carry": jax.tree.map(lambda c: c[:1], carry)}
    params = jax.jit(lambda k: nn.meta.unbox(param_init(model, example)(k)))(jax.random.key(0))
    step, state = jitted_step(model, objectives.get(config.objective), jax.tree.map(jnp.copy, params), config)  # donated
    state["carry"] = jax.device_put(carry)
    apply = jax.jit(lambda p, b, c: model.apply({"params": p}, {**b, "carry": c}))
    return (step, state), (lambda p, b, key: (p, apply(p, b, carry)), params)


def theirs(cfg: elmo.ElmoConfig, config: Any, batch: dict[str, np.ndarray]) -> tuple[tuple[Callable, Any], tuple[Callable, Any]]:
    """(train step, None) and (forward, None) of the PyTorch biLM; they read their own copy of the batch."""
    import torch

    model = torch_bilm(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=config.optimizer.learning_rate, eps=config.optimizer.eps,
                            weight_decay=config.optimizer.weight_decay)
    b = {k: torch.from_numpy(v).long() if v.dtype == np.int32 else torch.from_numpy(v) for k, v in batch.items()}
    rows = batch["input_ids"].shape[0]
    carry = {d: (torch.zeros(cfg.n_layers, rows, cfg.projection_dim), torch.zeros(cfg.n_layers, rows, cfg.lstm_dim))
             for d in ("forward", "backward")}

    def train(state, _batch, _key):
        model.train()
        opt.zero_grad()
        loss, new = model(b, carry)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.clip_norm)
        opt.step()
        carry.update({d: tuple(s.detach() for s in new[d]) for d in new})
        return state, loss.detach()

    def forward(state, _batch, _key):
        model.eval()
        with torch.no_grad():
            return state, model(b, carry)[0]

    return (train, None), (forward, None)


def torch_bilm(cfg: elmo.ElmoConfig) -> Any:
    """The PyTorch biLM of `cfg`'s shape (torch imported only when the reference runs)."""
    import torch
    from torch import nn as tnn

    class Bilm(tnn.Module):
        def __init__(self):
            super().__init__()
            self.char_embed = tnn.Embedding(cfg.n_characters, cfg.char_embedding_dim, padding_idx=0)
            self.convs = tnn.ModuleList(tnn.Conv1d(cfg.char_embedding_dim, n, w) for w, n in cfg.filters)
            f = cfg.n_filters
            self.highways = tnn.ModuleList(tnn.Linear(f, 2 * f) for _ in range(cfg.n_highway))
            self.proj = tnn.Linear(f, cfg.projection_dim) if cfg.use_projection else tnn.Identity()
            stack = lambda: tnn.ModuleList(  # noqa: E731
                tnn.LSTM(cfg.projection_dim, cfg.lstm_dim, proj_size=cfg.projection_dim, batch_first=True)
                for _ in range(cfg.n_layers))
            self.lstms = tnn.ModuleList([stack(), stack()])  # forward, backward
            self.softmax = tnn.Linear(cfg.projection_dim, cfg.vocab_size)
            self.dropout = tnn.Dropout(cfg.dropout_rate)
            self.act = torch.relu if cfg.activation == "relu" else torch.tanh

        def words(self, char_ids):
            b, length, chars = char_ids.shape
            x = self.char_embed(char_ids.reshape(b * length, chars)).transpose(1, 2)
            h = torch.cat([self.act(conv(x).max(dim=-1).values) for conv in self.convs], -1)
            for layer in self.highways:
                carry, transform = layer(h).chunk(2, -1)
                gate = torch.sigmoid(carry)
                h = gate * torch.relu(transform) + (1 - gate) * h
            return self.proj(h).reshape(b, length, -1)

        def forward(self, batch, carry):
            loss, new = 0.0, {}
            for i, (d, prefix) in enumerate((("forward", ""), ("backward", "backward_"))):
                x, states = self.words(batch[f"{prefix}char_ids"]), []
                for k, lstm in enumerate(self.lstms[i]):
                    h0, c0 = carry[d][0][k:k + 1], carry[d][1][k:k + 1]
                    out, (h, c) = lstm(self.dropout(x), (h0, c0))
                    x = out + x if k > 0 else out
                    states.append((h, c))
                logits = self.softmax(self.dropout(x))
                loss = loss + 0.5 * torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), batch[f"{prefix}targets"].reshape(-1))
                new[d] = (torch.cat([h for h, _ in states]), torch.cat([c for _, c in states]))
            return loss, new

    return Bilm()


COLUMNS = ["preset", "pass", "batch_size", "seq_len", "device", "torch_threads", "tokens_per_s", "torch_tokens_per_s", "ratio",
           "cpu_ratio"]
FORMATS = {"tokens_per_s": "{:,.0f}", "torch_tokens_per_s": "{:,.0f}", "ratio": "{:.2f}x", "cpu_ratio": "{:.2f}x"}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=tuple(WORDS))
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--seq_len", type=int, default=None, help="words per segment; default: the preset's")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--torch_threads", type=int, default=1,
                   help="PyTorch's intra-op threads: with more, its OpenMP barriers spin on a loaded machine "
                        "(measured 9.2 s against 0.21 s of CPU for one tiny forward pass with 2 threads at load 17)")
    p.add_argument("--out", default="runs/benchmarks")
    args = p.parse_args(argv)

    config = recipe_config("elmo", args.preset, WORDS[args.preset], "float32", "none")
    config.model = ml_collections.ConfigDict({k: v for k, v in config.model.items() if k not in ("dtype", "remat")})
    length = args.seq_len or config.data.max_seq_length
    cfg = models.encoder_config(config.model)
    batch = random_batch(cfg, args.batch_size, length)
    import torch

    torch.set_num_threads(args.torch_threads)
    (our_step, our_fwd), (their_step, their_fwd) = ours(config, batch), theirs(cfg, config, batch)
    rows = []
    for name, runs in (("train", [our_step, their_step]), ("forward", [our_fwd, their_fwd])):
        measured = throughput(runs, batch, args.steps, models.flops_per_token(config), None)
        rows.append(dict(preset=args.preset, **{"pass": name}, batch_size=args.batch_size, seq_len=length,
                         device=jax.devices()[0].device_kind, torch_threads=args.torch_threads, tokens_per_s=measured["tokens_per_s"],
                         torch_tokens_per_s=measured["hf_tokens_per_s"], ratio=measured["ratio"],
                         cpu_ratio=measured["cpu_ratio"]))
    report.append(rows, pathlib.Path(args.out), "lstm", COLUMNS, FORMATS)
    return rows


if __name__ == "__main__":
    main()
