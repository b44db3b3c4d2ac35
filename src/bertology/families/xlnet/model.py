"""XLNet (Yang et al. 2019): permutation language modelling with two-stream relative attention.

Follows the reference (zihangdai/xlnet `modeling.py`, mirrored by Hugging Face's XLNetModel):
- the content stream h starts from the token embeddings and sees itself; the query stream g
  starts from one learned `mask_emb` per prediction and does not see its own token. Both run
  through the same layers (every weight shared); keys and values come from the content stream and
  the memory only (`relative.RelativeAttention`);
- who sees whom is the batch's `perm_mask` [B, L, L] (1 = query i may NOT see key j, the
  reference's and HF's convention) plus padding (`input_mask`, 1 = real token); the content
  stream additionally always sees itself. Memory slots are visible to everyone;
- `target_mapping` [B, P, L] places the P predictions (one-hot rows; zero rows pad); the logits
  are [B, P, V] at them. Without it only the content stream runs and the logits are [B, L, V];
- relative segment encodings: one learned vector per "same / different segment" (memory counts
  as segment 0), r_s_bias beside r_w/r_r (shared across layers unless `untie_r`; per layer in
  Large and in HF, which always unties them);
- `bi_data`: the second half of the batch holds the reversed copies, whose relative distances
  are negated (HF's and the reference's per-core layout, here over the rows a call gets);
- memory (`batch["carry"]`): per layer the layer's content input at the first `reuse_len`
  positions, appended to the old memory, last `mem_len` kept, gradient stopped (`_cache_mem`).
  A zero carry means no memory (HF with mems=None); the reference instead starts its training
  from visible zero states.

Fine-tuning (`task_trunk`, `TaskTrunk`) reads the content stream: `sequence` [B, L, d] and
`pooled`, the summary of the last position, which is the final `<cls>` because XLNet puts `<cls>`
last and pads on the left (`data.cls_position="last"`, `data.padding_side="left"`).
"""

from __future__ import annotations

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
    encodings,
    extend_memory,
    recurrence,
    run_carry,
    visible_keys,
)
from bertology.models.transformer import Embeddings, FeedForward, TransformerConfig, dense, init, zeros

EXTRA_KEYS = ("mem_len", "reuse_len", "clamp_len", "untie_r", "bi_data")
REQUIRED = dict(positions="none", type_vocab_size=0, embedding_norm=False, scale_embeddings=False, norm="post",
                embedding_size=None, share_layers="none", scan_layers=False)


class Network(nn.Module):
    """The stack both the pretraining `Model` and the fine-tuning `TaskTrunk` run: embeddings,
    `mask_emb`, relative attention and feed-forward layers (the parameters they share)."""

    cfg: TransformerConfig
    xl: Recurrence

    def setup(self):
        cfg = self.cfg
        self.embeddings = Embeddings(cfg, name="embeddings")
        self.mask_emb = self.param("mask_emb", init(cfg, (None, None, "embed")), (1, 1, cfg.hidden_size))
        if not self.xl.untie_r:
            self.biases = Biases(cfg, segments=True, name="biases")
        self.attention = [RelativeAttention(cfg, segment_term=True, untie_r=self.xl.untie_r, name=f"attention_{i}")
                          for i in range(cfg.num_layers)]
        self.ffn = [FeedForward(cfg, name=f"ffn_{i}") for i in range(cfg.num_layers)]
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def streams(self, batch: dict[str, jax.Array], carry: dict[str, jax.Array],
                deterministic: bool) -> tuple[jax.Array, jax.Array | None, list[jax.Array]]:
        """(the content stream's last layer, the query stream's or None without `target_mapping`,
        every layer's content input)."""
        cfg, xl = self.cfg, self.xl
        ids = batch["input_ids"]
        rows, qlen = ids.shape
        input_mask = batch.get("input_mask", jnp.ones_like(ids))
        segments = batch.get("segment_ids", jnp.zeros_like(ids))
        mem_len = carry["memory_mask"].shape[1]

        # who sees whom: valid keys minus the permutation's blocks; memory slots are never blocked
        keys = visible_keys(carry["memory_mask"], input_mask)[:, None, :]
        perm = batch.get("perm_mask")
        blocked = (jnp.zeros((rows, qlen, qlen), bool) if perm is None else perm > 0)
        allowed_g = keys & ~jnp.concatenate([jnp.zeros((rows, qlen, mem_len), bool), blocked], axis=2)
        itself = jnp.arange(mem_len + qlen)[None, :] == mem_len + jnp.arange(qlen)[:, None]
        allowed = allowed_g | itself[None]
        different = segments[:, :, None] != jnp.concatenate([jnp.zeros((rows, mem_len), segments.dtype), segments],
                                                            axis=1)[:, None, :]

        h = self.embeddings(ids, jnp.zeros_like(ids), jnp.zeros_like(ids), deterministic)
        mapping = batch.get("target_mapping")
        g = None
        if mapping is not None:
            g = self.dropout(jnp.broadcast_to(self.mask_emb.astype(h.dtype), (rows, mapping.shape[1], cfg.hidden_size)),
                             deterministic=deterministic)
        pos = self.dropout(encodings(qlen, mem_len + qlen, cfg.hidden_size, xl.clamp_len, xl.bi_data, rows),
                           deterministic=deterministic)
        biases = None if xl.untie_r else self.biases()
        inputs = []
        for i in range(cfg.num_layers):
            inputs.append(h)
            h, g = self.attention[i](h, carry["memory"][:, i], pos, allowed, deterministic, biases, different, g,
                                     allowed_g, mapping)
            h = self.ffn[i](h, deterministic)
            if g is not None:
                g = self.ffn[i](g, deterministic)
        return h, g, inputs


class Model(Network):
    """Pretraining: {"logits": [B, P, V] at the predictions (or [B, L, V]), "carry": the next memory}."""

    def setup(self):
        super().setup()
        self.lm_bias = self.param("lm_bias", zeros(("vocab",)), (self.cfg.padded_vocab_size,))

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        carry = carry_of(batch, self.cfg, self.xl)
        h, g, inputs = self.streams(batch, carry, deterministic)
        out = self.dropout(h if g is None else g, deterministic=deterministic)
        logits = self.cfg.real_logits(self.embeddings.attend(out).astype(jnp.float32) + self.lm_bias)
        reuse = self.xl.reuse_len or h.shape[1]
        memory, memory_mask = extend_memory(carry["memory"], carry["memory_mask"],
                                            jnp.stack(inputs, 1)[:, :, :reuse])
        return {"logits": logits, "carry": {"memory": memory, "memory_mask": memory_mask}}


class TaskTrunk(Network):
    """Fine-tuning (`task_trunk`): the content stream alone, without memory, permutation or query
    stream, as the reference and Hugging Face fine-tune. `pooled` is the summary of the last
    position (the final `<cls>`, since inputs put it last and pad on the left): HF's
    `SequenceSummary` with `summary_type="last"`, a dense layer and tanh, which only fine-tuning
    trains."""

    def setup(self):
        super().setup()
        self.summary = dense(self.cfg, self.cfg.hidden_size, ("embed", "hidden"), "summary")

    def __call__(self, inputs: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        h, _, layers = self.streams(inputs, carry_of(inputs, self.cfg, self.xl), deterministic)
        return {"sequence": h, "pooled": jnp.tanh(self.summary(h[:, -1])), "layers": [*layers, h]}


def config(model_config: ml_collections.ConfigDict | dict) -> TransformerConfig:
    """The network's TransformerConfig; refuses settings this family does not compute."""
    cfg = transformer_config(model_config, EXTRA_KEYS)
    wrong = {k: getattr(cfg, k) for k, v in REQUIRED.items() if getattr(cfg, k) != v}
    if wrong:
        raise UserError(f"XLNet does not compute model settings {wrong}; use { {k: REQUIRED[k] for k in wrong} }")
    return cfg


def build(model_config: ml_collections.ConfigDict | dict) -> Model:
    return Model(config(model_config), recurrence(model_config, EXTRA_KEYS))


def initial_carry(model_config: ml_collections.ConfigDict | dict, batch_size: int) -> dict[str, jax.Array] | None:
    """Per-layer memory zeros [batch, layers, mem_len, d] and its mask (`relative.run_carry`)."""
    return run_carry(config(model_config), recurrence(model_config, EXTRA_KEYS), batch_size)


def task_trunk(cfg: TransformerConfig, name: str) -> TaskTrunk:
    """The fine-tuning trunk of the family contract (`bertology.models`): relative attention with
    per-layer biases (what `trunk` gives any checkpoint), no memory, no clamp, no bi_data."""
    return TaskTrunk(cfg, Recurrence(), name=name)


def trunk(params: dict) -> dict:
    """A pretraining run's parameters as `TaskTrunk` holds them: without the LM output bias, and
    shared r_w/r_r/r_s biases (`untie_r=False`) copied into every layer, which computes the same
    network with the layout fine-tuning (like Hugging Face's XLNet) always uses."""
    out = {k: v for k, v in params.items() if k not in ("lm_bias", "biases")}
    if "biases" in params:
        for name in (k for k in out if k.startswith("attention_")):
            out[name] = {**out[name], "biases": params["biases"]}
    return out


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Both streams over [memory; segment] (the content stream's last layer only as keys and values)
    and the tied output at the predictions (`data.num_predict`)."""
    cfg = config(config_.model)
    xl = recurrence(config_.model, EXTRA_KEYS)
    length, predictions = config_.data.max_seq_length, config_.data.num_predict
    head = flops.lm_head(cfg, transform=False) * predictions / length
    if nominal:
        return flops.TRAIN * (flops.stack(cfg, length, nominal=True) + head)
    return flops.TRAIN * (flops.relative_stack(cfg, length, xl.mem_len, segment_term=True, last_queries=False)
                          + flops.query_stream(cfg, length, xl.mem_len, predictions) + head)


FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, build=build,
                task_trunk=task_trunk, initial_carry=initial_carry)
