"""Transformer-XL (Dai et al. 2019): a causal LM with relative attention and segment recurrence.

Each layer attends to its own input states of the previous segment (the memory, `mem_len` slots,
gradient stopped) as well as to the current segment, so context grows with depth across
segments while a step still costs one segment. Follows the reference PyTorch code
(kimiyoung/transformer-xl `mem_transformer.py`) and Hugging Face's port of it: post-LN, ReLU
feed-forward, token embeddings scaled by sqrt(d), sinusoidal relative encodings with `clamp_len`,
`r_w_bias`/`r_r_bias` per layer (`untie_r`, HF's and the TF code's default) or shared (the
PyTorch code's), the memory of layer i being layer i's input.

The output layer is a full softmax tied to the token table plus a bias, not the reference's
adaptive softmax (cutoffs [2e4, 4e4, 2e5] at WT103's 267k words): with an 8k BPE vocabulary the
full softmax is exact and cheap. HF's TransfoXL with `cutoffs=[]`, `div_val=1` is the same network.

`Model(batch)` reads `batch["carry"]` ({"memory": [B, layers, mem_len, d], "memory_mask":
[B, mem_len]}, see `relative`) and returns {"logits": [B, L, V] float32, "carry": the next one}.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.models import Family, flops, transformer_config
from bertology.models.relative import (
    Biases,
    Recurrence,
    RelativeAttention,
    carry_of,
    causal_mask,
    encodings,
    extend_memory,
    recurrence,
    run_carry,
    visible_keys,
)
from bertology.models.transformer import Embeddings, FeedForward, TransformerConfig, zeros

EXTRA_KEYS = ("mem_len", "clamp_len", "same_length", "untie_r")
# What the network is in TransformerConfig terms; anything else would be silently ignored.
REQUIRED = dict(positions="none", type_vocab_size=0, embedding_norm=False, scale_embeddings=True, norm="post",
                embedding_size=None, share_layers="none", scan_layers=False)


class Model(nn.Module):
    cfg: TransformerConfig
    xl: Recurrence

    def setup(self):
        cfg = self.cfg
        self.embeddings = Embeddings(cfg, name="embeddings")
        if not self.xl.untie_r:
            self.biases = Biases(cfg, name="biases")
        self.attention = [RelativeAttention(cfg, untie_r=self.xl.untie_r, name=f"attention_{i}")
                          for i in range(cfg.num_layers)]
        self.ffn = [FeedForward(cfg, name=f"ffn_{i}") for i in range(cfg.num_layers)]
        self.output_bias = self.param("output_bias", zeros(("vocab",)), (cfg.padded_vocab_size,))
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, Any]:
        cfg, xl = self.cfg, self.xl
        ids = batch["input_ids"]
        qlen = ids.shape[1]
        input_mask = batch.get("input_mask", jnp.ones_like(ids))
        carry = carry_of(batch, cfg, xl)
        x = self.embeddings(ids, jnp.zeros_like(ids), jnp.zeros_like(ids), deterministic)
        allowed = causal_mask(visible_keys(carry["memory_mask"], input_mask), qlen, xl.mem_len, xl.same_length)
        pos = self.dropout(encodings(qlen, xl.mem_len + qlen, cfg.hidden_size, xl.clamp_len), deterministic)
        biases = None if xl.untie_r else self.biases()
        inputs = []
        for i in range(cfg.num_layers):
            inputs.append(x)
            x, _ = self.attention[i](x, carry["memory"][:, i], pos, allowed, deterministic, biases)
            x = self.ffn[i](x, deterministic)
        out = self.dropout(x, deterministic=deterministic)
        logits = cfg.real_logits(self.embeddings.attend(out).astype(jnp.float32) + self.output_bias)
        memory, memory_mask = extend_memory(carry["memory"], carry["memory_mask"], jnp.stack(inputs, 1))
        return {"logits": logits, "carry": {"memory": memory, "memory_mask": memory_mask}}


def config(model_config: ml_collections.ConfigDict | dict) -> TransformerConfig:
    """The network's TransformerConfig; refuses settings this family does not compute."""
    cfg = transformer_config(model_config, EXTRA_KEYS)
    wrong = {k: v for k, v in REQUIRED.items() if getattr(cfg, k) != v}
    if wrong:
        raise UserError(f"Transformer-XL computes {wrong}; remove those model settings (got "
                        f"{ {k: getattr(cfg, k) for k in wrong} })")
    return cfg


def build(model_config: ml_collections.ConfigDict | dict) -> Model:
    return Model(config(model_config), recurrence(model_config, EXTRA_KEYS))


def initial_carry(model_config: ml_collections.ConfigDict | dict, batch_size: int) -> dict[str, jax.Array] | None:
    """Per-layer memory zeros [batch, layers, mem_len, d] and its mask (`relative.run_carry`)."""
    return run_carry(config(model_config), recurrence(model_config, EXTRA_KEYS), batch_size)


def trunk(params: dict) -> dict:
    return params


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The relative stack over [memory; segment] and the tied output at every position."""
    cfg = config(config_.model)
    xl = recurrence(config_.model, EXTRA_KEYS)
    length = config_.data.max_seq_length
    if nominal:
        return flops.TRAIN * (flops.stack(cfg, length, nominal=True) + flops.lm_head(cfg, transform=False))
    return flops.TRAIN * (flops.relative_stack(cfg, length, xl.mem_len) + flops.lm_head(cfg, transform=False))


# No fine-tuning trunk yet (task_modes empty): a head would read the last real token through the
# memory-less stack, as GPT's does; until then fine-tuning and features refuse its runs in one line.
FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, build=build,
                initial_carry=initial_carry, task_modes=())
