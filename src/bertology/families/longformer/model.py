"""Longformer (Beltagy, Peters and Cohan 2020, "Longformer: The Long-Document Transformer",
arXiv 2004.05150; reference code github.com/allenai/longformer, and Hugging Face's
`LongformerForMaskedLM`, transformers' `models/longformer/modeling_longformer.py`).

RoBERTa's network (post-LN, learned positions counted from the padding id + 1, one segment
type, the same MLM head) whose self-attention is local and global (§3.1):
- every token attends to the keys at most `attention_window[i] // 2` positions away on each side
  (HF's `one_sided_attn_window_size`; dilation 1, as the released MLM checkpoints), computed
  banded (`attention.banded`) in O(length · window), not over the [L, L] square;
- task-chosen global tokens (the batch's `global_attention_mask`, HF's name; none for MLM; fine-
  tuning rows that bring none get their task kind's, `task_inputs`: [CLS], or [CLS] + the question)
  are attended by every token, with the ordinary key and value projections, in the same softmax
  as the window; and they attend to every token through their own projections
  (`query_global`, `key_global`, `value_global`), so global attention learns apart from the
  local one (§3.1, "Linear Projections for Global Attention").

Why the attention lives here and not in the core `Attention`: a global row is not a masked
row of the same softmax, it is another attention with other projections whose output replaces
the local one; a mask kind cannot say that, and a hook for it in the core layer would be used by
this family alone. The core hosts the generic part, the banded window with extra keys every
query sees (`attention.banded`), which its own sliding-window mask also runs on xla.

Global positions are gathered into at most `max_global_tokens` slots per row (a static shape
under jit); a row flagging more keeps its first `max_global_tokens` as global and treats the
rest as local. HF pads rows to a multiple of the window internally; the band needs no padding
of the row (padding keys never weigh), so outputs at real tokens are HF's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertology.errors import UserError
from bertology.families.roberta import model as roberta
from bertology.models import Family, ModelConfig, encoder_config, flops, transformer_config
from bertology.models.attention import attend, banded
from bertology.models.transformer import (
    Dropout,
    Embeddings,
    FeedForward,
    HeadsDense,
    TransformerConfig,
    dense,
    extend,
    gather_positions,
    inputs,
    layer_norm,
    residual_scale,
    sublayer_output,
)

Array = jax.Array

EXTRA_KEYS = ("attention_window", "max_global_tokens")
# Core settings this stack does not read: any other value would be silently ignored.
UNSUPPORTED = dict(norm="post", positions="absolute", share_layers="none", scan_layers=False, embedding_size=None,
                   local_attention=None, scale_attention=True, scale_embeddings=False, attention_backend="xla",
                   remat="none")


@dataclasses.dataclass(frozen=True)
class Config(TransformerConfig):
    """The trunk's config: the core settings, each layer's window and the global slots.

    `attention_window`: each layer's total window (HF's `attention_window`: one even number for
    every layer, or one per layer); a query sees `attention_window[i] // 2` keys on each side.
    `max_global_tokens`: how many global positions per row the attention gathers (static)."""

    attention_window: tuple[int, ...] = (512,)
    max_global_tokens: int = 16

    def __post_init__(self):
        super().__post_init__()
        if len(self.attention_window) not in (1, self.num_layers):
            raise UserError(f"model.attention_window has {len(self.attention_window)} entries; give one for every "
                            f"layer or one per layer ({self.num_layers})")
        if any(w < 2 or w % 2 for w in self.attention_window):
            raise UserError(f"model.attention_window={list(self.attention_window)}: each a positive even number "
                            "(the window's total width, half on each side)")
        if self.max_global_tokens < 1:
            raise UserError(f"model.max_global_tokens={self.max_global_tokens}: at least 1")

    def one_sided(self, layer: int) -> int:
        """Layer `layer`'s keys on each side of a query."""
        windows = self.attention_window
        return windows[layer if len(windows) > 1 else 0] // 2


def config(model_config: ModelConfig) -> Config:
    """The `model` block's config; core settings the stack does not read must keep their defaults."""
    block = dict(model_config)
    cfg = transformer_config(block, EXTRA_KEYS)
    for key, want in UNSUPPORTED.items():
        if getattr(cfg, key) != want:
            raise UserError(f"model.{key}={getattr(cfg, key)!r} is not read by Longformer's stack; leave it at {want!r}")
    given = block.get("attention_window")
    windows = (512,) if given is None else (given,) if isinstance(given, int) else tuple(given)
    slots = block.get("max_global_tokens")
    return extend(cfg, Config, attention_window=tuple(int(w) for w in windows),
                  max_global_tokens=Config.max_global_tokens if slots is None else int(slots))


def global_slots(flags: Array, keys: Array, slots: int) -> tuple[Array, Array, Array]:
    """(is_global [B, L] bool, positions [B, G] int, valid [B, G] bool): the first `slots` real
    positions a row flags, gathered into G = min(slots, L) slots (unused slots invalid)."""
    flags = (flags > 0) & keys
    is_global = flags & (jnp.cumsum(flags, axis=1) <= slots)
    g = min(slots, flags.shape[1])
    positions = jnp.argsort(~is_global, axis=1, stable=True)[:, :g]
    return is_global, positions, jnp.take_along_axis(is_global, positions, axis=1)


class LongformerAttention(nn.Module):
    """Sliding-window + global self-attention, with the residual and the post-LN norm (the core
    `Attention`'s parameter names, plus `query_global`, `key_global`, `value_global`)."""

    cfg: Config
    window: int  # keys on each side

    @nn.compact
    def __call__(self, x: Array, keys: Array, flags: Array | None, deterministic: bool) -> Array:
        cfg = self.cfg
        norm = layer_norm(cfg, "norm")
        heads = lambda name: HeadsDense(cfg, to_heads=True, name=name)  # noqa: E731
        q, k, v = heads("query")(x), heads("key")(x), heads("value")(x)
        dropout = None
        if not (deterministic or cfg.attention_dropout_rate == 0.0):
            drop = Dropout(cfg.attention_dropout_rate)
            dropout = lambda probs: drop(probs.astype(q.dtype), deterministic=False)  # noqa: E731
        everyone = jnp.ones(keys.shape, jnp.int32)
        if flags is None:
            if self.is_initializing():  # the global projections exist whether or not a batch flags globals
                for name in ("query_global", "key_global", "value_global"):
                    heads(name)(x[:, :1])
            ctx = banded(q, k, v, window=self.window, query_segments=everyone, key_segments=keys, dropout=dropout)
        else:
            is_global, slots, valid = global_slots(flags, keys, cfg.max_global_tokens)
            take = lambda y: jnp.take_along_axis(y, slots[:, :, None, None], axis=1)  # noqa: E731
            # every query: its band (global keys left out, they come in as the extra keys) and the global keys
            extra = (take(k), take(v), jnp.broadcast_to(valid[:, None, :], (*keys.shape, valid.shape[1])))
            ctx = banded(q, k, v, window=self.window, query_segments=everyone, key_segments=keys & ~is_global,
                         dropout=dropout, extra=extra)
            # the global queries: every real key, through the global projections
            q_g = heads("query_global")(gather_positions(x, slots))
            k_g, v_g = heads("key_global")(x), heads("value_global")(x)
            ctx_g = attend(q_g, k_g, v_g, allowed=keys[:, None, None, :], dropout=dropout)  # [B, G, heads, d]
            slot = jnp.clip(jnp.cumsum(is_global, axis=1) - 1, 0, slots.shape[1] - 1)
            ctx = jnp.where(is_global[:, :, None, None], take_along(ctx_g, slot), ctx)
        ctx = jnp.where(keys[:, :, None, None], ctx, 0)  # HF zeroes the padded queries' probabilities
        out = HeadsDense(cfg, to_heads=False, scale=residual_scale(cfg), name="output")(ctx)
        return sublayer_output(cfg, x, out, norm, deterministic)


def take_along(x: Array, index: Array) -> Array:
    """x [B, G, ...] at [B, L] slot indices -> [B, L, ...]."""
    return jnp.take_along_axis(x, index.reshape(*index.shape, *(1,) * (x.ndim - 2)), axis=1)


class Encoder(nn.Module):
    """Embeddings and the layers (`attention_{i}`, `ffn_{i}`: the core stack's names, so RoBERTa's
    parameters load by name) and the optional pooler; returns what the core `Encoder` does
    (`sequence`, `pooled`, `layers`), so fine-tuning and features take it as the trunk."""

    cfg: Config

    def setup(self):
        cfg = self.cfg
        self.embeddings = Embeddings(cfg, name="embeddings")
        self.attention = [LongformerAttention(cfg, cfg.one_sided(i), name=f"attention_{i}")
                          for i in range(cfg.num_layers)]
        self.ffn = [FeedForward(cfg, name=f"ffn_{i}") for i in range(cfg.num_layers)]
        if cfg.pooler:
            self.pooler = dense(cfg, cfg.hidden_size, ("embed", "hidden"), "pooler")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 outputs_at: Array | None = None) -> dict[str, Array]:
        cfg = self.cfg
        ids, segments, positions = inputs(batch)
        x = self.embeddings(ids, segments, positions + cfg.position_offset, deterministic)
        keys = batch["input_mask"] > 0
        flags = batch.get("global_attention_mask")
        layers = [x]
        for i in range(cfg.num_layers):
            x = self.attention[i](x, keys, flags, deterministic)
            x = self.ffn[i](x, deterministic)
            layers.append(x)
        first = x[:, 0]
        if outputs_at is not None:
            x = layers[-1] = gather_positions(x, outputs_at)
        pooled = jnp.tanh(self.pooler(first)) if cfg.pooler else first
        return {"sequence": x, "pooled": pooled, "layers": layers}

    def attend(self, x: Array) -> Array:
        return self.embeddings.attend(x)


# RoBERTa's MLM model (the MLM head read at the masked positions) on this family's encoder
Model = functools.partial(roberta.Model, stack=Encoder)


def build(model_config: ModelConfig) -> nn.Module:
    return Model(config(model_config))


def task_trunk(cfg: Config, name: str) -> Encoder:
    """The fine-tuning trunk: the pretraining `Encoder` (parameters `trunk(params)`)."""
    return Encoder(cfg, name=name)


def trunk(params: dict) -> dict:
    return params["encoder"]


# Where fine-tuning puts global attention when the rows bring none, by the task's head kind (§6 of the
# paper, and Hugging Face's task models): a sequence-level head reads the summary token, so it is global
# (`LongformerForSequenceClassification` / `...ForMultipleChoice`: `global_attention_mask[:, 0] = 1`);
# extractive QA makes the question global (`LongformerForQuestionAnswering`: every token before the
# first separator, `_compute_global_attention_mask`); token tagging (`...ForTokenClassification`) has none.
GLOBAL_BY_KIND = {"classification": "summary", "regression": "summary", "choice": "summary", "qa": "question"}


def global_attention(kind: str | None, ids: np.ndarray, mask: np.ndarray, cls_id: int, sep_id: int) -> np.ndarray | None:
    """[..., L] int32 flags of the global positions of rows `ids` for head kind `kind`, or None
    where the kind has none (`GLOBAL_BY_KIND`)."""
    rule = GLOBAL_BY_KIND.get(kind or "")
    if rule is None:
        return None
    if rule == "summary":  # the row's first summary token (a tokenizer may reuse its id as the separator)
        at = ids == cls_id
        flags = at & (np.cumsum(at, axis=-1) == 1)
    else:  # [CLS] and the question: everything before the first separator
        flags = np.cumsum(ids == sep_id, axis=-1) == 0
    return (flags & (mask > 0)).astype(np.int32)


def task_inputs(cfg: Config, tokenizer: Any, arrays: dict[str, np.ndarray],
                kind: str | None = None) -> dict[str, np.ndarray]:
    """Fine-tuning rows with the `global_attention_mask` of their task kind (`GLOBAL_BY_KIND`) where
    they bring none, so a classifier's [CLS] sees the whole document rather than its window.

    A row flagging more than `model.max_global_tokens` (a long question) is refused rather than
    silently cut to its first slots."""
    if "global_attention_mask" in arrays:
        return arrays
    flags = global_attention(kind, arrays["input_ids"], arrays["input_mask"], tokenizer.cls_id, tokenizer.sep_id)
    if flags is None:
        return arrays
    most = int(flags.sum(-1).max(initial=0))
    if most > cfg.max_global_tokens:
        raise UserError(f"{kind} rows make up to {most} tokens global but model.max_global_tokens="
                        f"{cfg.max_global_tokens}; raise it (QA: at least data.max_query_length + 1)")
    return {**arrays, "global_attention_mask": flags}


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """RoBERTa's count with the attention's scores and context over the keys a query computes:
    its banded blocks (3 · window // 2 keys, at most the row), not the whole row."""
    cfg = encoder_config(config.model)
    length = config.data.max_seq_length
    keys = min(length, 3 * max(cfg.one_sided(i) for i in range(cfg.num_layers)))
    predictions = config.data.max_predictions_per_seq
    full = flops.masked_lm(cfg, length, predictions, nominal, rows=length)
    # the stack's attention term is 2 · 2 · keys · width per query and layer; swap the row's length for the band's
    width = cfg.num_heads * cfg.head_dim
    return full - flops.TRAIN * cfg.num_layers * 2 * 2 * (length - keys) * width


# Its layers take the global-token mask, so the stack is its own (`task_trunk`); fine-tuning rows get
# the mask their task kind wants (`task_inputs`).
FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, build=build,
                task_trunk=task_trunk, task_inputs=task_inputs, task_input_keys=("global_attention_mask",))
