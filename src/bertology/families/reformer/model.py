"""Reformer (Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer", arXiv
2001.04451; reference code github.com/google/trax `trax/models/reformer`), computed as Hugging
Face's `ReformerModelWithLMHead` / `ReformerForMaskedLM` (transformers 4.57.6,
`models/reformer/modeling_reformer.py`, whose line numbers are cited below).

The network, in HF's order:
- embeddings (`ReformerEmbeddings`, 327-370): the token table with dropout, plus position
  embeddings: axial ones by default (`AxialPositionEmbeddings`, 217-310; one table per axis of
  `axial_pos_shape`, [s_k, d_k] stored in HF's broadcastable shape, position p reading row
  unravel(p)_k of table k, the d_k summing to the hidden size), or a learned table
  (`axial_pos_embds=False`, `PositionEmbeddings`, 313-324). No LayerNorm, no segments;
- `num_layers` reversible layers (section 3; `ReformerLayer`, 1521-1618), each y1 = x1 + f(x2),
  y2 = x2 + g(y1) with both streams starting as the embeddings; f is pre-LN self-attention
  without biases, LSH (`attn_layers[i] == "lsh"`, shared QK, `num_hashes` rounds) or chunked
  local attention, then an output projection without bias and dropout (`ReformerAttention`,
  1375-1462); g is pre-LN dense (bias) -> dropout -> activation (ReLU by default) -> dense
  (bias) -> dropout (`ChunkReformerFeedForward`, 1465-1518), run `chunk_size_feed_forward`
  tokens at a time when set. The attention math is `bertology.models.lsh`, the reversible
  stack `bertology.models.reversible`;
- the two streams concatenated [y1; y2] (2H wide), one LayerNorm over them, dropout
  (`ReformerEncoder`, 1801-1868);
- the LM head: one Linear(2H, vocab) without bias plus a bias vector (`ReformerOnlyLMHead`,
  1871-1895), untied from the token table (it is 2H wide). `is_decoder=True` is the causal LM
  (`ReformerModelWithLMHead`: logits at every position, causal masks in both attentions);
  `is_decoder=False` is HF's `ReformerForMaskedLM` (bidirectional; the logits read at the
  batch's `masked_positions`, which is what the shared MLM objective scores).

Rows are padded inside to a multiple of the chunk lengths' least common multiple when longer
than the shortest chunk (HF's `_pad_to_mult_of_chunk_length`, 2091-2121: in evaluation only, HF
refuses in training; here in both), the padding masked, and cut back after.

**Random rotations.** HF draws the LSH rotations from torch's RNG on every call (seeded with
`hash_seed` when the config sets one, the same draw for every layer then). Here they are an
input: `Model(...).apply(params, batch, rotations=R)` hashes every LSH layer with R
([heads, head_dim, num_hashes, rotation_size / 2], the shape HF draws, e.g. the test's
`torch.manual_seed(seed); torch.randn(...)`), or with R[j] for the j-th LSH layer when R has a
leading axis of one entry per LSH layer. Without them, training draws fresh N(0, 1) rotations
per layer and step from the `dropout` rng (`lsh.random_rotations`), and evaluation uses fixed
ones drawn from numpy's generator seeded with (`hash_seed` or 0, layer) (`lsh.fixed_rotations`:
evaluation is deterministic; HF's unseeded evaluation is not).

**Training memory.** Training (`deterministic=False`) runs the layers through
`reversible.stack`, whose backward pass recomputes each layer's input from its output (the LSH
buckets of the forward pass kept and reused, as HF does), so the activations kept for the
backward pass do not grow with depth; evaluation runs the same blocks as plain code and also
returns every layer's x2 stream (HF's `hidden_states`). `reversible=False` trains through plain
autodiff instead (the reference the tests compare it with).

Training differs from HF's in places that do not change what the parameters mean: the dropout
masks are the core's hashed `Dropout`'s, the rotations are drawn as above, rows need not be a
multiple of the chunk lengths (they are padded as in evaluation) nor fill the axial table (HF
trains on rows of exactly prod(axial_pos_shape) tokens), and packed rows (`packing_ids`, the
causal data's) attend within their own document in both attentions (HF has no packing). HF's
axial dropout (`dropout2d`, zeroing the encodings of every position sharing the second axial
index) is kept. Not here: HF's incremental decoding (cached buckets and states), so generation
refuses these runs.

**Fine-tuning** (`TaskTrunk`): the trunk under a task head, which reads the first token's state
for sequence-level tasks; training goes through the reversible stack, so a 4,096-token row
fine-tunes in the memory pretraining needs (configs/finetune/long_range.py:reformer_4096).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.models import Family, ModelConfig, fixed_architecture, flops, lsh, reversible
from bertology.models.heads import add_vocab_bias
from bertology.models.transformer import (
    Dropout,
    HeadsDense,
    TransformerConfig,
    dense,
    embedding_init,
    extend,
    gather_positions,
    init,
    inputs,
    layer_norm,
    zeros,
)

Array = jax.Array

EXTRA_KEYS = ("attn_layers", "num_hashes", "num_buckets", "lsh_attn_chunk_length", "lsh_num_chunks_before",
              "lsh_num_chunks_after", "local_attn_chunk_length", "local_num_chunks_before", "local_num_chunks_after",
              "lsh_attention_dropout_rate", "axial_pos_embds", "axial_pos_shape", "axial_pos_embds_dim",
              "axial_norm_std", "chunk_size_feed_forward", "is_decoder", "hash_seed")

# What the core's TransformerConfig must say for this network (the settings it does not read are
# pinned too, so a block asking for another network is refused rather than silently ignored).
ARCHITECTURE = {
    "norm": "pre",
    "first_attention_norm": True,
    "norm_kind": "layernorm",
    "norm_bias": True,
    "use_bias": True,  # the feed-forward block's; the attention projections never have one
    "positions": "absolute",
    "type_vocab_size": 0,
    "embedding_norm": False,
    "embedding_size": None,
    "pooler": False,
    "share_layers": "none",
    "scan_layers": False,
    "remat": "none",  # the reversible stack recomputes instead
    "adapter_size": None,
    "position_offset": 0,
    "scale_embeddings": False,
    "scale_attention": True,
    "local_attention": None,
    "sparse_block_size": None,
    "activation_dropout_rate": 0.0,
    "init_scheme": "bert",
    "attention_backend": "xla",
    "scale_residual_init": False,
    "num_decoder_layers": None,
}
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
KINDS = ("lsh", "local")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The Reformer's own `model` keys (`EXTRA_KEYS`), HF's names and defaults (ReformerConfig)."""

    attn_layers: tuple[str, ...]  # each layer's attention: "lsh" or "local"
    is_decoder: bool = False  # causal LM (True) or the bidirectional masked LM
    # LSH layers: rounds, buckets (None: HF's rule from the length, `lsh.default_buckets`), chunks of
    # sorted tokens each seeing `before` chunks before it and `after` after it, probability dropout
    # (the local layers' is the core's attention_dropout_rate)
    num_hashes: int = 1
    num_buckets: int | tuple[int, ...] | None = None
    lsh_attn_chunk_length: int = 64
    lsh_num_chunks_before: int = 1
    lsh_num_chunks_after: int = 0
    lsh_attention_dropout_rate: float = 0.0
    hash_seed: int | None = None  # seeds evaluation's rotations (`lsh.fixed_rotations`); None: 0
    # local layers: chunks of positions, each seeing `before` chunks before it and `after` after it
    local_attn_chunk_length: int = 64
    local_num_chunks_before: int = 1
    local_num_chunks_after: int = 0
    # positions: axial tables (one per axis of the shape, their widths summing to the hidden size,
    # initialised N(0, std)) or, when False, a learned table of max_position_embeddings rows
    axial_pos_embds: bool = True
    axial_pos_shape: tuple[int, ...] = (64, 64)
    axial_pos_embds_dim: tuple[int, ...] = (64, 192)
    axial_norm_std: float = 1.0
    chunk_size_feed_forward: int = 0  # the feed-forward block over this many tokens at a time; 0: all at once

    @property
    def chunk_multiple(self) -> int:
        """Rows are padded to a multiple of this (HF's `_get_least_common_mult_chunk_len`)."""
        return math.lcm(*(self.chunk(kind) for kind in set(self.attn_layers)))

    @property
    def min_chunk(self) -> int:
        """Rows no longer than this are not padded (HF's `_get_min_chunk_len`)."""
        return min(self.chunk(kind) for kind in set(self.attn_layers))

    def chunk(self, kind: str) -> int:
        return self.lsh_attn_chunk_length if kind == "lsh" else self.local_attn_chunk_length

    def window(self, kind: str) -> tuple[int, int]:
        """(chunks before, chunks after) a chunk of this kind of layer sees."""
        if kind == "lsh":
            return self.lsh_num_chunks_before, self.lsh_num_chunks_after
        return self.local_num_chunks_before, self.local_num_chunks_after

    def padded_length(self, length: int) -> int:
        """The length a row of `length` tokens runs at (HF's `must_pad_to_match_chunk_length`)."""
        if length % self.chunk_multiple and length > self.min_chunk:
            return length + self.chunk_multiple - length % self.chunk_multiple
        return length

    def buckets(self, length: int, max_positions: int) -> int | tuple[int, ...]:
        """The LSH layers' buckets at a padded length (`num_buckets`, else HF's rule)."""
        if self.num_buckets is not None:
            return self.num_buckets
        return lsh.default_buckets(length, self.lsh_attn_chunk_length, max_positions)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def settings(model_config: ModelConfig, cfg: TransformerConfig) -> Settings:
    """The `Settings` of a `model` block, checked against its trunk config `cfg`. An absent
    `attn_layers` alternates local and LSH layers, local first (HF's default pattern)."""
    block = dict(model_config)
    given = {k: _tuple(block[k]) for k in EXTRA_KEYS if block.get(k) is not None}
    given.setdefault("attn_layers", tuple(KINDS[1 - i % 2] for i in range(cfg.num_layers)))
    s = Settings(**given)
    problems = []
    if len(s.attn_layers) != cfg.num_layers or not set(s.attn_layers) <= set(KINDS):
        problems.append(f"model.attn_layers={list(s.attn_layers)} must name {cfg.num_layers} layers "
                        f"(model.num_layers), each one of {KINDS}")
    for key in ("num_hashes", "lsh_attn_chunk_length", "local_attn_chunk_length"):
        if getattr(s, key) < 1:
            problems.append(f"model.{key}={getattr(s, key)} must be >= 1")
    for key in ("lsh_num_chunks_before", "lsh_num_chunks_after", "local_num_chunks_before", "local_num_chunks_after",
                "chunk_size_feed_forward"):
        if getattr(s, key) < 0:
            problems.append(f"model.{key}={getattr(s, key)} must be >= 0")
    factors = (s.num_buckets,) if isinstance(s.num_buckets, int) else s.num_buckets or ()
    if any(not isinstance(f, int) or f < 2 or f % 2 for f in factors):
        problems.append(f"model.num_buckets={s.num_buckets}: an even number of buckets >= 2, a list of such "
                        "factors, or None (HF's rule from the length)")
    if s.is_decoder and (s.lsh_num_chunks_after or s.local_num_chunks_after):
        problems.append("model.is_decoder=True (causal) needs model.lsh_num_chunks_after=0 and "
                        "model.local_num_chunks_after=0 (HF's ReformerModelWithLMHead asserts it)")
    if s.axial_pos_embds and (len(s.axial_pos_shape) != len(s.axial_pos_embds_dim)
                              or sum(s.axial_pos_embds_dim) != cfg.hidden_size):
        problems.append(f"model.axial_pos_embds_dim={list(s.axial_pos_embds_dim)} must have one width per axis of "
                        f"model.axial_pos_shape={list(s.axial_pos_shape)} and sum to hidden_size={cfg.hidden_size}")
    if cfg.activation not in ACTIVATIONS:
        problems.append(f"model.activation={cfg.activation!r}: the Reformer's feed-forward block takes one of "
                        f"{ACTIVATIONS}")
    if problems:
        raise UserError("; ".join(problems))
    return s


@dataclasses.dataclass(frozen=True)
class Config(TransformerConfig):
    """The trunk's config (`config`): the core settings and the Reformer's `Settings`, so that
    fine-tuning and features, which get a family's trunk config from the `model` block alone
    (`Family.task_trunk`), can rebuild the trunk."""

    reformer: Settings = Settings(attn_layers=())


def config(model_config: ModelConfig) -> Config:
    """The trunk's config: `ARCHITECTURE` filled in where the block leaves it out, a block that
    sets any of it otherwise refused; the Reformer's own keys checked (`settings`)."""
    block = {k: v for k, v in dict(model_config).items() if k not in EXTRA_KEYS}
    cfg = fixed_architecture(block, ARCHITECTURE, "Reformer", "(pre-LN reversible layers over learned or axial "
                             "positions, no segments, pooler or embedding norm)")
    return extend(cfg, Config, reformer=settings(model_config, cfg))


class Embeddings(nn.Module):
    """Token embeddings with dropout plus axial (or learned) position embeddings, HF's
    `ReformerEmbeddings`."""

    cfg: Config

    @nn.compact
    def __call__(self, ids: Array, positions: Array, deterministic: bool) -> Array:
        cfg, s = self.cfg, self.cfg.reformer
        token = nn.Embed(cfg.padded_vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype,
                         embedding_init=embedding_init(cfg, ("vocab", "embed")), name="token")
        x = Dropout(cfg.dropout_rate)(token(ids), deterministic=deterministic)
        if not s.axial_pos_embds:
            learned = nn.Embed(cfg.max_position_embeddings, cfg.hidden_size, dtype=cfg.compute_dtype,
                               embedding_init=embedding_init(cfg, (None, "embed")), name="position")
            return x + Dropout(cfg.dropout_rate)(learned(positions), deterministic=deterministic)
        shape = s.axial_pos_shape
        index = jnp.unravel_index(jnp.clip(positions, 0, math.prod(shape) - 1), shape)
        parts = []
        for k, (size, width) in enumerate(zip(shape, s.axial_pos_embds_dim)):
            stored = tuple(size if a == k else 1 for a in range(len(shape))) + (width,)  # HF's broadcastable shape
            normal: nn.initializers.Initializer = nn.with_logical_partitioning(nn.initializers.normal(s.axial_norm_std),
                                                                               (None,) * len(stored))
            table = self.param(f"axial_{k}", normal, stored)
            parts.append(jnp.asarray(table).reshape(size, width)[index[k]].astype(cfg.compute_dtype))
        encodings = jnp.concatenate(parts, axis=-1)
        if not deterministic and cfg.dropout_rate > 0:
            # HF's dropout2d over the encodings transposed to [batch, s_1, s_0, ...]: one draw per row and
            # second-axis index, zeroing every position that shares it (a 1-axis table: per position)
            axis = 1 if len(shape) > 1 else 0
            keep = Dropout(cfg.dropout_rate)(jnp.ones((ids.shape[0], shape[axis]), encodings.dtype),
                                             deterministic=False)
            encodings = encodings * jnp.take_along_axis(keep, index[axis], axis=1)[..., None]
        return x + encodings


class SelfAttention(nn.Module):
    """f of layer `layer`: LayerNorm, LSH or local self-attention (projections without bias),
    output projection without bias, dropout (HF's `ReformerAttention`). Returns (output, the LSH
    buckets or None)."""

    cfg: Config
    kind: str
    layer: int

    @nn.compact
    def __call__(self, x: Array, keys: Array, documents: Array | None, rotations: Array | None,
                 buckets: Array | None, deterministic: bool) -> tuple[Array, Array | None]:
        cfg, s = self.cfg, self.cfg.reformer
        plain = dataclasses.replace(cfg, use_bias=False)
        h = layer_norm(cfg, "norm")(x)
        before, after = s.window(self.kind)
        rate = s.lsh_attention_dropout_rate if self.kind == "lsh" else cfg.attention_dropout_rate
        dropout: Callable[[Array], Array] | None = None
        if not deterministic and rate > 0:
            drop = Dropout(rate)
            dropout = lambda probs: drop(probs, deterministic=False)  # noqa: E731
        if self.kind == "lsh":
            qk = HeadsDense(plain, to_heads=True, name="query_key")(h)
            v = HeadsDense(plain, to_heads=True, name="value")(h)
            num_buckets = s.buckets(x.shape[1], cfg.max_position_embeddings)
            if rotations is None:
                shape = (cfg.num_heads, cfg.head_dim, s.num_hashes, lsh.rotation_size(num_buckets) // 2)
                rotations = (jnp.asarray(lsh.fixed_rotations(s.hash_seed or 0, self.layer, shape)) if deterministic
                             else lsh.random_rotations(self.make_rng("dropout"), shape))
            ctx, buckets = lsh.lsh_attend(qk, v, rotations=rotations, num_buckets=num_buckets, chunk=s.lsh_attn_chunk_length,
                                          before=before, after=after, keys=keys, causal=s.is_decoder,
                                          documents=documents, buckets=buckets, dropout=dropout)
        else:
            q, k, v = (HeadsDense(plain, to_heads=True, name=n)(h) for n in ("query", "key", "value"))
            ctx = lsh.local_attend(q, k, v, chunk=s.local_attn_chunk_length, before=before, after=after, keys=keys,
                                   causal=s.is_decoder, documents=documents, dropout=dropout)
        out = HeadsDense(plain, to_heads=False, name="output")(ctx)
        return Dropout(cfg.dropout_rate)(out, deterministic=deterministic), buckets


class FeedForward(nn.Module):
    """g: LayerNorm, dense, dropout, activation, dense, dropout (HF's `ChunkReformerFeedForward`:
    its dropout comes before the activation)."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg = self.cfg
        h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(layer_norm(cfg, "norm")(x))
        h = cfg.act(Dropout(cfg.dropout_rate)(h, deterministic=deterministic))
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)
        return Dropout(cfg.dropout_rate)(h, deterministic=deterministic)


def _attention_block(module: SelfAttention, deterministic: bool) -> reversible.Block:
    """f as a pure function of (params, x2, context, buckets) for `reversible`."""
    def f(params: Any, x: Array, context: dict, hints: Array | None) -> tuple[Array, Array | None]:
        out: tuple[Array, Array | None] = module.apply(  # type: ignore[assignment]
            {"params": params}, x, context["keys"], context["documents"], context["rotations"], hints,
            deterministic, rngs=None if deterministic else {"dropout": context["f_rng"]})
        return out
    return f


def _ffn_block(module: FeedForward, chunk: int, deterministic: bool) -> reversible.Block:
    """g as a pure function for `reversible`: `chunk` > 0 runs it over that many tokens at a time
    (`jax.lax.map`, so one chunk's [chunk, intermediate] activations exist at once; each chunk its
    own dropout key)."""
    def run(params: Any, y: Array, rng: Array | None) -> Array:
        out: Array = module.apply(  # type: ignore[assignment]
            {"params": params}, y, deterministic, rngs=None if rng is None else {"dropout": rng})
        return out

    def g(params: Any, y: Array, context: dict, hints: Any) -> tuple[Array, None]:
        rng = None if deterministic else context["g_rng"]
        batch, length, width = y.shape
        if chunk <= 0 or length <= chunk:
            return run(params, y, rng), None
        pad = -length % chunk
        n = (length + pad) // chunk
        pieces = jnp.pad(y, ((0, 0), (0, pad), (0, 0))).reshape(batch, n, chunk, width).swapaxes(0, 1)
        if rng is None:
            out = jax.lax.map(lambda p: run(params, p, None), pieces)
        else:
            out = jax.lax.map(lambda a: run(params, a[0], a[1]), (pieces, jax.random.split(rng, n)))
        return out.swapaxes(0, 1).reshape(batch, n * chunk, width)[:, :length], None
    return g


class Reformer(nn.Module):
    """The trunk: embeddings, the reversible layers, the norm over [y1; y2] and its dropout.
    Returns `sequence` [batch, length, 2H] and, in evaluation, `layers`: the x2 stream before
    each layer and after the last (HF's `hidden_states`), at the row's own length."""

    cfg: Config
    reversible: bool = True

    def setup(self):
        cfg, s = self.cfg, self.cfg.reformer
        self.embeddings = Embeddings(cfg, name="embeddings")
        self.attention = [SelfAttention(cfg, kind, i, name=f"attention_{i}") for i, kind in enumerate(s.attn_layers)]
        self.ffn = [FeedForward(cfg, name=f"ffn_{i}") for i in range(cfg.num_layers)]
        self.final_norm = layer_norm(cfg, "final_norm")
        self.dropout = Dropout(cfg.dropout_rate)

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 rotations: Array | None = None) -> dict[str, Any]:
        cfg, s = self.cfg, self.cfg.reformer
        ids, _, positions = inputs(batch)
        length = ids.shape[1]
        keys = batch["input_mask"] > 0 if "input_mask" in batch else jnp.ones(ids.shape, bool)
        documents = batch.get("packing_ids")
        padded = s.padded_length(length)
        limit = math.prod(s.axial_pos_shape) if s.axial_pos_embds else cfg.max_position_embeddings
        if padded > min(limit, cfg.max_position_embeddings):
            raise UserError(f"a row of {length} tokens (padded to {padded}, a multiple of the chunk lengths) is longer "
                            f"than model.max_position_embeddings={cfg.max_position_embeddings}"
                            + (f" or the axial positions' {limit} (model.axial_pos_shape)" if s.axial_pos_embds else ""))
        if padded != length:  # HF's _pad_to_mult_of_chunk_length: masked tokens after the row, positions running on
            extra = padded - length
            ids = jnp.pad(ids, ((0, 0), (0, extra)))
            keys = jnp.pad(keys, ((0, 0), (0, extra)))
            positions = jnp.concatenate([positions, positions[:, -1:] + 1 + jnp.arange(extra)], axis=1)
            documents = None if documents is None else jnp.pad(documents, ((0, 0), (0, extra)))
        x = self.embeddings(ids, positions, deterministic)
        contexts = self._contexts(keys, documents, rotations, deterministic)
        if self.is_initializing():  # create the parameters through the bound modules
            x1 = x2 = x
            for i in range(cfg.num_layers):
                x1 = x1 + self.attention[i](x2, keys, documents, contexts[i]["rotations"], None, deterministic)[0]
                x2 = x2 + self.ffn[i](x1, deterministic)
            y1, y2, states = x1, x2, list[Array]()
        else:
            layers = tuple((_attention_block(SelfAttention(cfg, kind, i, parent=None), deterministic),
                            _ffn_block(FeedForward(cfg, parent=None), s.chunk_size_feed_forward, deterministic))
                           for i, kind in enumerate(s.attn_layers))
            params = self.variables["params"]
            weights = tuple((params[f"attention_{i}"], params[f"ffn_{i}"]) for i in range(cfg.num_layers))
            if self.reversible and not deterministic:
                y1, y2 = reversible.stack(layers, weights, x, x, contexts)
                states = []
            else:
                y1, y2, states, _ = reversible.forward(layers, weights, x, x, contexts)
        out = self.dropout(self.final_norm(jnp.concatenate([y1, y2], axis=-1)), deterministic=deterministic)
        return {"sequence": out[:, :length], "layers": [h[:, :length] for h in states]}

    def _contexts(self, keys: Array, documents: Array | None, rotations: Array | None,
                  deterministic: bool) -> tuple[dict, ...]:
        """Each layer's non-differentiable inputs: the masks, its LSH rotations (given, or None to
        draw them) and, in training, its two blocks' dropout keys."""
        s = self.cfg.reformer
        n = self.cfg.num_layers
        rngs = [None] * (2 * n) if deterministic else list(jax.random.split(self.make_rng("dropout"), 2 * n))
        lsh_index = {i: j for j, i in enumerate(i for i, kind in enumerate(s.attn_layers) if kind == "lsh")}
        out = []
        for i in range(n):
            mine = None
            if rotations is not None and i in lsh_index:
                mine = rotations if rotations.ndim == 4 else rotations[lsh_index[i]]
            out.append({"keys": keys, "documents": documents, "rotations": mine, "f_rng": rngs[2 * i],
                        "g_rng": rngs[2 * i + 1]})
        return tuple(out)


class Model(nn.Module):
    """The trunk (`reformer`) and the LM head (`lm_head`: `decoder` [2H, vocab] without bias,
    `bias`). `is_decoder`: `logits` [batch, length, vocab] at every position (causal LM);
    otherwise `mlm_logits` [batch, n, vocab] at the batch's `masked_positions` (every position
    when it has none)."""

    cfg: Config
    reversible: bool = True

    def setup(self):
        self.reformer = Reformer(self.cfg, self.reversible, name="reformer")
        self.lm_head = _Head(self.cfg, name="lm_head")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 rotations: Array | None = None) -> dict[str, Array]:
        seq = self.reformer(batch, deterministic=deterministic, rotations=rotations)["sequence"]
        if not self.cfg.reformer.is_decoder and "masked_positions" in batch:
            seq = gather_positions(seq, batch["masked_positions"])
        return {"logits" if self.cfg.reformer.is_decoder else "mlm_logits": self.lm_head(seq)}


class _Head(nn.Module):
    """HF's `ReformerOnlyLMHead`: Linear(2H, vocab) without bias (`decoder`) plus `bias`."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        logits = nn.Dense(cfg.padded_vocab_size, use_bias=False, kernel_init=init(cfg, ("embed", "vocab")),
                          dtype=cfg.compute_dtype, name="decoder")(x)
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,), jnp.float32)
        return cfg.real_logits(add_vocab_bias(logits.astype(jnp.float32), bias))


class TaskTrunk(Reformer):
    """The fine-tuning trunk (`Family.task_trunk`): the pretraining trunk itself (its parameters
    are `trunk(params)`, nothing new), whose sequence-level heads read the first token's
    [y1; y2] state, as HF's `ReformerClassificationHead` reads `hidden_states[:, 0]` (its extra
    dense + tanh layer is not here: our heads are one dense layer, as for every trunk without a
    pooler). Fine-tuning trains through the reversible stack; features read `layers`."""

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 rotations: Array | None = None) -> dict[str, Any]:
        out = super().__call__(batch, deterministic=deterministic, rotations=rotations)
        return {**out, "pooled": out["sequence"][:, 0]}


def task_trunk(cfg: Config, name: str) -> TaskTrunk:
    return TaskTrunk(cfg, name=name)


def build(model_config: ModelConfig) -> Model:
    cfg = config(model_config)
    return Model(cfg)


def trunk(params: dict) -> dict:
    return params["reformer"]


def attention_flops(cfg: TransformerConfig, s: Settings, length: int) -> float:
    """Forward FLOPs per token of the layers' attention products (scores and context), and of
    the LSH layers' hashing: LSH, per round, a chunk and its neighbours' keys (every key of a row
    of one chunk, unhashed); local, its chunk and neighbours'."""
    a = cfg.num_heads * cfg.head_dim
    padded = s.padded_length(length)
    total = 0.0
    for kind in s.attn_layers:
        before, after = s.window(kind)
        chunk = s.chunk(kind)
        if padded <= chunk:
            total += 2 * 2 * padded * a
            continue
        keys = chunk * (1 + before + after)
        if kind == "lsh":
            buckets = s.buckets(padded, cfg.max_position_embeddings)
            total += s.num_hashes * (2 * 2 * keys * a + 2 * a * lsh.rotation_size(buckets) // 2)
        else:
            total += 2 * 2 * keys * a
    return total


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Training FLOPs per input token (x3: forward and backward, the reversible stack's
    recomputation not counted, as the core counts no remat): per layer the projections (LSH:
    shared query-key and value; local: query, key and value; both the output), the attention
    products of `attention_flops`, the feed-forward block; then the LM head (2H x vocab) at every
    position (causal) or at the predictions (MLM). `nominal`: the paper-style count, full
    attention over the row (`flops.stack`), plus the head."""
    cfg = config(config_.model)
    s = cfg.reformer
    length = config_.data.max_seq_length
    rows = 1.0 if s.is_decoder else config_.data.max_predictions_per_seq / length
    head = 2 * 2 * cfg.hidden_size * cfg.vocab_size * rows
    if nominal:
        return flops.TRAIN * (flops.stack(cfg, length, nominal=True) + head)
    h, a = cfg.hidden_size, cfg.num_heads * cfg.head_dim
    projections = sum((2 if kind == "lsh" else 3) * 2 * h * a + 2 * a * h for kind in s.attn_layers)
    ffn = cfg.num_layers * 2 * 2 * h * cfg.intermediate_size
    return flops.TRAIN * (projections + attention_flops(cfg, s, length) + ffn + head)


# Its trunk has no Houlsby adapters.
FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, build=build,
                task_modes=("full", "features"), task_trunk=task_trunk)
