"""The one Transformer encoder that every family configures.

BERT, RoBERTa, ALBERT, ELECTRA and SpanBERT differ in their embeddings (factorized or not), in
which layers share parameters, and in which positions may attend to which; the layer itself is
the same post-LN block. So this module exposes exactly those knobs in `EncoderConfig` and nothing
else, and families never fork it.

Every parameter is created with logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`,
`hidden`); `bertology.train.sharding` maps them to mesh axes through the config's rules table.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError

Array = jax.Array

SHARING = ("none", "all", "attention", "ffn")
ATTENTION_MASKS = ("padding", "packed")
REMAT = ("none", "full", "dots_saveable")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Shape and behaviour of the trunk. Field names follow the BERT paper's vocabulary."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    embedding_size: int | None = None  # ALBERT's E; None means E = hidden_size (no projection)
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    share_layers: str = "none"  # none | all | attention | ffn (ALBERT's cross-layer sharing)
    attention_mask: str = "padding"  # padding | packed (no attention across packed documents)
    dtype: str = "float32"  # compute dtype; parameters always stay float32
    remat: str = "none"  # none | full | dots_saveable

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                "pick num_heads that divides it"
            )
        for name, allowed in (
            ("share_layers", SHARING),
            ("attention_mask", ATTENTION_MASKS),
            ("remat", REMAT),
        ):
            if getattr(self, name) not in allowed:
                raise UserError(f"model.{name}={getattr(self, name)!r} is unknown; use one of {allowed}")
        if self.dtype not in ("float32", "bfloat16"):
            raise UserError(f"model.dtype={self.dtype!r} is unknown; use float32 or bfloat16")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def embed_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)


def init(cfg: EncoderConfig, names: tuple[str | None, ...]) -> nn.initializers.Initializer:
    """BERT's truncated-normal(initializer_range) init, tagged with logical axis names."""
    return nn.with_logical_partitioning(
        nn.initializers.truncated_normal(stddev=cfg.initializer_range), names
    )


def zeros(names: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones(names: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def layer_norm(cfg: EncoderConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        dtype=cfg.compute_dtype,
        scale_init=ones(("embed",)),
        bias_init=zeros(("embed",)),
        name=name,
    )


def attention_bias(kind: str, input_mask: Array, segment_ids: Array | None, dtype: Any) -> Array:
    """Additive bias [batch, 1, q, k]: 0 where attention is allowed, a large negative elsewhere.

    `padding`: every query sees every real key (BERT). `packed`: additionally a query only sees
    keys of its own document; `segment_ids` then holds the packed document ids (1, 2, ...).
    """
    allowed = input_mask[:, None, None, :].astype(bool)
    if kind == "packed":
        same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        allowed = allowed & same
    return jnp.where(allowed, 0.0, jnp.finfo(dtype).min).astype(dtype)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, then residual and post-LN."""

    cfg: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, bias: Array, deterministic: bool) -> Array:
        cfg = self.cfg
        dense = functools.partial(
            nn.DenseGeneral,
            features=(cfg.num_heads, cfg.head_dim),
            kernel_init=init(cfg, ("embed", "heads", "kv")),
            bias_init=zeros(("heads", "kv")),
            dtype=cfg.compute_dtype,
        )
        q = dense(name="query")(x)
        k = dense(name="key")(x)
        v = dense(name="value")(x)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(cfg.head_dim).astype(q.dtype)
        probs = jax.nn.softmax(scores.astype(jnp.float32) + bias, axis=-1).astype(q.dtype)
        probs = nn.Dropout(cfg.attention_dropout_rate)(probs, deterministic=deterministic)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))
        out = nn.DenseGeneral(
            features=cfg.hidden_size,
            axis=(-2, -1),
            kernel_init=init(cfg, ("heads", "kv", "embed")),
            bias_init=zeros(("embed",)),
            dtype=cfg.compute_dtype,
            name="output",
        )(ctx)
        out = nn.Dropout(cfg.dropout_rate)(out, deterministic=deterministic)
        return layer_norm(cfg, "norm")(x + out)


class FeedForward(nn.Module):
    """Position-wise GELU MLP, then residual and post-LN."""

    cfg: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg = self.cfg
        h = nn.Dense(
            cfg.intermediate_size,
            kernel_init=init(cfg, ("embed", "mlp")),
            bias_init=zeros(("mlp",)),
            dtype=cfg.compute_dtype,
            name="intermediate",
        )(x)
        h = nn.gelu(h, approximate=False)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = nn.Dense(
            cfg.hidden_size,
            kernel_init=init(cfg, ("mlp", "embed")),
            bias_init=zeros(("embed",)),
            dtype=cfg.compute_dtype,
            name="output",
        )(h)
        h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
        return layer_norm(cfg, "norm")(x + h)


def _remat(module_cls: type[nn.Module], policy: str) -> type[nn.Module]:
    if policy == "none":
        return module_cls
    checkpoint_policy = (
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable if policy == "dots_saveable" else None
    )
    return nn.remat(module_cls, policy=checkpoint_policy, static_argnums=(-1,))


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, LayerNorm, dropout.

    With `embedding_size` set (ALBERT) the sum lives in E dimensions and is projected to H.
    """

    cfg: EncoderConfig

    def setup(self):
        cfg = self.cfg
        embed = functools.partial(nn.Embed, features=cfg.embed_dim, dtype=cfg.compute_dtype)
        self.token = embed(cfg.vocab_size, embedding_init=init(cfg, ("vocab", "embed")), name="token")
        self.position = embed(
            cfg.max_position_embeddings, embedding_init=init(cfg, (None, "embed")), name="position"
        )
        self.segment = embed(cfg.type_vocab_size, embedding_init=init(cfg, (None, "embed")), name="segment")
        self.norm = layer_norm(cfg, "norm")
        self.dropout = nn.Dropout(cfg.dropout_rate)
        if cfg.embedding_size is not None:
            self.projection = nn.Dense(
                cfg.hidden_size,
                kernel_init=init(cfg, ("embed", "hidden")),
                bias_init=zeros(("hidden",)),
                dtype=cfg.compute_dtype,
                name="projection",
            )

    def __call__(self, input_ids: Array, segment_ids: Array, positions: Array, deterministic: bool) -> Array:
        x = self.token(input_ids) + self.position(positions) + self.segment(segment_ids)
        x = self.dropout(self.norm(x), deterministic=deterministic)
        if self.cfg.embedding_size is not None:
            x = self.projection(x)
        return x

    def attend(self, x: Array) -> Array:
        """Logits against the token table: the output layer tied to the input embeddings."""
        return self.token.attend(x)


class Encoder(nn.Module):
    """Embeddings, N post-LN layers and the pooler. Returns every layer's output too.

    Layer sharing (`share_layers`) decides how many attention and feed-forward blocks exist:
    one shared instance applied N times, or N distinct ones.
    """

    cfg: EncoderConfig

    def setup(self):
        cfg = self.cfg
        self.embeddings = Embeddings(cfg, name="embeddings")
        n = cfg.num_layers
        n_attn = 1 if cfg.share_layers in ("all", "attention") else n
        n_ffn = 1 if cfg.share_layers in ("all", "ffn") else n
        attn_cls = _remat(SelfAttention, cfg.remat)
        ffn_cls = _remat(FeedForward, cfg.remat)
        self.attention = [attn_cls(cfg, name=f"attention_{i}") for i in range(n_attn)]
        self.ffn = [ffn_cls(cfg, name=f"ffn_{i}") for i in range(n_ffn)]
        self.pooler = nn.Dense(
            cfg.hidden_size,
            kernel_init=init(cfg, ("embed", "hidden")),
            bias_init=zeros(("hidden",)),
            dtype=cfg.compute_dtype,
            name="pooler",
        )

    def __call__(
        self,
        input_ids: Array,
        input_mask: Array,
        segment_ids: Array | None = None,
        positions: Array | None = None,
        packing_ids: Array | None = None,
        *,
        deterministic: bool = True,
    ) -> dict[str, Array]:
        cfg = self.cfg
        if segment_ids is None:
            segment_ids = jnp.zeros_like(input_ids)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = self.embeddings(input_ids, segment_ids, positions, deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        bias = attention_bias(cfg.attention_mask, input_mask, packing_ids, jnp.float32)
        layers = [x]
        for i in range(cfg.num_layers):
            x = self.attention[i % len(self.attention)](x, bias, deterministic)
            x = self.ffn[i % len(self.ffn)](x, deterministic)
            x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
            layers.append(x)
        pooled = jnp.tanh(self.pooler(x[:, 0]))
        return {"sequence": x, "pooled": pooled, "layers": layers}

    def attend(self, x: Array) -> Array:
        return self.embeddings.attend(x)
