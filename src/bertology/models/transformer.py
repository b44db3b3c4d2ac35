"""The one Transformer core that every family configures: encoder, decoder, encoder-decoder.

Families differ in a handful of settings, so this module exposes exactly those in
`TransformerConfig` and families never fork it:
- where the LayerNorm sits (`norm`: post, BERT and GPT-1; pre with a final norm, GPT-2 and T5),
  which norm (`norm_kind`), biases (`use_bias`), the activation (GELU, tanh-GELU, ReLU, gated);
- positions (`positions`: a learned absolute table, T5's relative bias buckets, rotary embeddings
  of the queries and keys (Su et al. 2021, RoFormer), or none), segment
  embeddings (`type_vocab_size`, 0 for none), a LayerNorm on the embeddings (`embedding_norm`) and
  BART's sqrt(d) scaling of the token embeddings (`scale_embeddings`);
- attention: a head width independent of hidden/heads (`head_size`, T5's d_kv) and whether the
  scores are divided by sqrt(head width) (`scale_attention`; T5 folds it into the initialisation,
  `init_scheme="fan_in"`);
- factorized embeddings (`embedding_size`, ALBERT/ELECTRA) and cross-layer sharing (`share_layers`);
- alternating local and global attention (`local_attention`, `global_attn_every_n_layers`: a
  sliding window in all but every n-th layer, each with its own rotary base, as ModernBERT);
- block-sparse self-attention (`sparse_block_size`, `num_random_blocks`: BigBird's global,
  window and random blocks, `block_sparse.py`), its own gathered products instead of `attend`;
- who may attend to whom, which is *data*: `Mask.from_batch` builds it from the batch
  (padding, packed documents, causal, a per-row prefix, or an explicit per-example matrix), so
  the same parameters serve BERT rows, GPT rows and UniLM's mixed rows.

Every parameter is created with logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`,
`hidden`, and `layers` for a scanned stack); `bertology.train.sharding` maps them to mesh axes
through the config's rules table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, TypeVar

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.models import block_sparse
from bertology.models.attention import GENERAL, FusedMask, attend, choose
from bertology.models.attention import sow as sow_attention

Array = jax.Array
# A branch beside every layer of a stack (`Stack.run`): (layer index, its input, the mask, deterministic) -> addend.
Parallel = Callable[[int, Array, "Mask", bool], Array]

SHARING = ("none", "all", "attention", "ffn")
REMAT = ("none", "full", "dots_saveable")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "gated_gelu", "geglu")


@jax.custom_vjp
def gelu(x: Array) -> Array:
    """The erf GELU, x·Φ(x), with its backward pass written out from x alone.

    Left to autodiff, the forward pass writes three [tokens, intermediate] arrays for the backward
    pass (x, x/2, -x/√2) and the backward pass reads them back. Here only x is kept (it is the
    feed-forward product's output, which exists anyway) and the derivative Φ(x) + x·φ(x) is
    recomputed in float32. Forward + backward of BERT-base's [16384, 3072] took 118 µs against
    autodiff's 182 µs on an H100 (`benchmarks.kernels`), and 0.92 ms against 2.87 ms for
    [256, 3072] on the 2-core CPU. The output is the same; the gradient differs by rounding.
    """
    return nn.gelu(x, approximate=False)


def _gelu_bwd(x: Array, g: Array) -> tuple[Array]:
    xf = x.astype(jnp.float32)
    cdf = 0.5 * (1.0 + jax.lax.erf(xf * jnp.float32(2 ** -0.5)))
    pdf = jnp.exp(-0.5 * xf * xf) * jnp.float32((2 * math.pi) ** -0.5)
    return ((g.astype(jnp.float32) * (cdf + xf * pdf)).astype(x.dtype),)


gelu.defvjp(lambda x: (gelu(x), x), _gelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def written_out_layer_norm(x: Array, scale: Array, bias: Array, eps: float, dtype: Any) -> Array:
    """LayerNorm over the last axis with float32 statistics, output in `dtype`, whose backward pass is
    written out: it keeps x and each row's mean and 1/std, recomputes the normalised x, and sums
    the scale's and bias's gradients over the rows itself.

    Why a choice (`model.norm_backward`) and not the default: XLA's own backward of flax's norm
    is fused with the dropout and residual around it, and which is faster depends on the rows per
    device. Alone, forward and backward of a bf16 [4096, 768] took 47.7 µs written out against
    flax's 100.9 on an H200, but [16384, 768] 105.9 against 71.6 (`benchmarks.kernels`;
    docs/accelerators.md, run 7); BERT-base 32×128's two norm-backward fusions were 14% of its
    device time there. The whole step, timed both ways (`benchmarks.accelerator --variant
    NAME:model.norm_backward=written_out`), decides."""
    return _layer_norm_fwd(x, scale, bias, eps, dtype)[0]


def _layer_norm_fwd(x: Array, scale: Array, bias: Array, eps: float, dtype: Any) -> tuple[Array, tuple]:
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True) + eps)
    return ((xf - mean) * rstd * scale + bias).astype(dtype), (x, mean, rstd, scale)


def _layer_norm_bwd(eps: float, dtype: Any, residuals: tuple, dy: Array) -> tuple[Array, Array, Array]:
    x, mean, rstd, scale = residuals
    xhat = (x.astype(jnp.float32) - mean) * rstd
    dyf = dy.astype(jnp.float32)
    g = dyf * scale
    dx = rstd * (g - jnp.mean(g, axis=-1, keepdims=True) - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    rows = dyf.reshape(-1, dyf.shape[-1])
    dscale = jnp.sum(rows * xhat.reshape(rows.shape), axis=0)
    return dx.astype(x.dtype), dscale.astype(scale.dtype), jnp.sum(rows, axis=0).astype(scale.dtype)


written_out_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
GATED = ("gated_gelu", "geglu")  # the activations whose feed-forward input is gated by a second projection
NORMS = ("post", "pre")
NORM_KINDS = ("layernorm", "rmsnorm")
NORM_BACKWARDS = ("autodiff", "written_out")
POSITIONS = ("absolute", "sinusoidal", "relative_bias", "rotary", "none")
INIT_SCHEMES = ("bert", "fan_in")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and behaviour of a Transformer stack. Field names follow the BERT paper's vocabulary."""

    vocab_size: int = 30522
    # Rows of the token table (and width of every [vocab] output tensor) rounded up to a multiple
    # of this, for matmul shapes accelerators tile well (Megatron-LM's --make-vocab-size-divisible-by,
    # nanoGPT's 50257 -> 50304); the padded ids' logits are sliced away (`real_logits`).
    vocab_multiple: int = 1
    hidden_size: int = 768
    num_layers: int = 12
    num_decoder_layers: int | None = None  # an encoder-decoder's decoder depth; None: num_layers (T5's, BART's)
    num_heads: int = 12
    intermediate_size: int = 3072
    embedding_size: int | None = None  # ALBERT's E; None means E = hidden_size (no projection)
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segment embeddings; 0: none (GPT)
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    share_layers: str = "none"  # none | all | attention | ffn (ALBERT's cross-layer sharing)
    dtype: str = "float32"  # compute dtype; parameters always stay float32
    remat: str = "none"  # none | full | dots_saveable
    scan_layers: bool = False  # run the layer stack with nn.scan: one compiled layer, params stacked on `layers`
    position_offset: int = 0  # first position id (RoBERTa's tables start after the padding index: 2)
    adapter_size: int | None = None  # Houlsby adapters' bottleneck width; None: no adapters
    pooler: bool = True  # dense+tanh on the first token; False (ELECTRA): `pooled` is that token as is
    # gelu (erf) | gelu_tanh | relu | gated_gelu (T5 v1.1: tanh-GELU gate) | geglu (erf-GELU gate: Shazeer 2020's
    # GEGLU, ModernBERT's; act(intermediate(x)) * intermediate_linear(x))
    activation: str = "gelu"
    norm: str = "post"  # post (BERT, GPT-1) | pre (GPT-2, T5: norm before each sublayer, one at the end)
    norm_kind: str = "layernorm"  # layernorm | rmsnorm (T5)
    use_bias: bool = True  # biases in dense layers (T5 has none)
    norm_bias: bool = True  # LayerNorm's additive bias (ModernBERT's norms have none); rmsnorm never has one
    norm_backward: str = "autodiff"  # autodiff | written_out: LayerNorm's backward pass (`WrittenOutLayerNorm`)
    # pre-LN only: the norm before the first layer's attention; False (ModernBERT): the first layer
    # reads the embedding output as is (HF ModernBertEncoderLayer's attn_norm is Identity at layer 0)
    first_attention_norm: bool = True
    positions: str = "absolute"  # absolute (learned table) | sinusoidal (fixed) | relative_bias (T5 buckets) | rotary | none
    rope_theta: float = 10000.0  # rotary: the base of the frequencies (ModernBERT's global layers: 160000)
    local_rope_theta: float | None = None  # rotary in the sliding-window layers; None: rope_theta
    # Sliding-window layers (ModernBERT; HF's `local_attention`): the window's total width, each query
    # seeing the keys at most local_attention // 2 positions away; None: every layer global.
    local_attention: int | None = None
    global_attn_every_n_layers: int = 1  # with local_attention: layer i is global when i % n == 0, local otherwise
    # BigBird's block-sparse self-attention (`block_sparse`): blocks of this many tokens, each query
    # block seeing the global first and last blocks, a 3-block window and `num_random_blocks` random
    # blocks; rows too short for the pattern attend fully (as HF). None: dense attention.
    sparse_block_size: int | None = None
    num_random_blocks: int = 0
    relative_buckets: int = 32  # T5's relative attention buckets ...
    relative_max_distance: int = 128  # ... and the distance where the last bucket starts
    embedding_norm: bool = True  # LayerNorm on the summed embeddings (BERT); GPT has none
    scale_residual_init: bool = False  # GPT-2: output projections of each block init'ed with std/sqrt(2·layers)
    head_size: int | None = None  # width of one attention head; None: hidden_size / num_heads (T5's d_kv is free)
    scale_attention: bool = True  # scores / sqrt(head width); T5 computes plain q·k
    scale_embeddings: bool = False  # token embeddings x sqrt(embedding width) (BART's scale_embedding)
    activation_dropout_rate: float = 0.0  # dropout after the feed-forward non-linearity (BART's activation_dropout)
    init_scheme: str = "bert"  # bert: truncated normal(initializer_range) | fan_in: Mesh TF's (T5), see `init`
    attention_backend: str = "xla"  # xla | cudnn | splash | auto: the kernel `attention.attend` runs (its docstring)

    def __post_init__(self):
        if self.vocab_multiple < 1:
            raise UserError(f"model.vocab_multiple={self.vocab_multiple}: the token table is padded to a multiple "
                            "of it; use 1 (no padding) or a positive multiple such as 128")
        if self.num_layers < 1:
            raise UserError(f"model.num_layers={self.num_layers}: the encoder needs at least one layer")
        if self.num_decoder_layers is not None and self.num_decoder_layers < 1:
            raise UserError(f"model.num_decoder_layers={self.num_decoder_layers}: the decoder needs at least one "
                            "layer (or None: as many as model.num_layers)")
        if self.head_size is None and self.hidden_size % self.num_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                "pick num_heads that divides it, or set head_size"
            )
        for name, allowed in (
            ("share_layers", SHARING),
            ("remat", REMAT),
            ("activation", ACTIVATIONS),
            ("norm", NORMS),
            ("norm_kind", NORM_KINDS),
            ("norm_backward", NORM_BACKWARDS),
            ("positions", POSITIONS),
            ("init_scheme", INIT_SCHEMES),
        ):
            if getattr(self, name) not in allowed:
                raise UserError(f"model.{name}={getattr(self, name)!r} is unknown; use one of {allowed}")
        # an explicit fused backend this platform, dtype, head width or dropout rules out stops here,
        # before anything is written, not at the first step's trace
        choose(self.attention_backend, platform=jax.default_backend(), dtype=self.dtype, head_dim=self.head_dim,
               mask=None, bias=False, dropout=self.attention_dropout_rate > 0)
        if self.dtype not in ("float32", "bfloat16"):
            raise UserError(f"model.dtype={self.dtype!r} is unknown; use float32 or bfloat16")
        if self.norm_backward == "written_out" and self.norm_kind != "layernorm":
            raise UserError(f"model.norm_backward='written_out' writes out LayerNorm's backward pass and "
                            f"norm_kind={self.norm_kind!r} has none; use norm_backward='autodiff'")
        if self.scan_layers and self.share_layers != "none":
            raise UserError("model.scan_layers needs distinct layers; set share_layers='none' or scan_layers=False")
        if self.positions == "rotary" and not (self.rope_theta > 0 and (self.local_rope_theta or 1) > 0):
            raise UserError(f"model.rope_theta={self.rope_theta}, local_rope_theta={self.local_rope_theta}: rotary "
                            "frequencies need a positive base (10000; ModernBERT: 160000 global, 10000 local)")
        if self.positions == "rotary" and self.head_dim % 2:
            raise UserError(f"model.positions='rotary' rotates pairs of head dimensions; head width {self.head_dim} "
                            "is odd")
        if self.local_attention is not None:
            if self.local_attention < 2:
                raise UserError(f"model.local_attention={self.local_attention}: the window's total width, at least 2 "
                                "(each query sees local_attention // 2 keys on each side); None for global attention")
            if self.global_attn_every_n_layers < 1:
                raise UserError(f"model.global_attn_every_n_layers={self.global_attn_every_n_layers}: must be >= 1 "
                                "(layer i is global when i % n == 0)")
        if self.sparse_block_size is not None and (self.sparse_block_size < 1 or self.num_random_blocks < 0
                                                   or self.local_attention is not None):
            raise UserError(f"model.sparse_block_size={self.sparse_block_size}, num_random_blocks="
                            f"{self.num_random_blocks}: need a block of at least 1 token, r >= 0, and no "
                            "model.local_attention (block-sparse attention has its own window)")
        if not self.first_attention_norm and self.norm != "pre":
            raise UserError("model.first_attention_norm=False leaves out a pre-LN norm; it needs model.norm='pre'")
        if self.scan_layers and (self.has_local_layers or not self.first_attention_norm):
            raise UserError("model.scan_layers repeats one layer; local/global layers (model.local_attention) and "
                            "model.first_attention_norm=False make the layers differ: set scan_layers=False")
        if self.share_layers in ("all", "attention") and (self.has_local_layers or not self.first_attention_norm):
            raise UserError(f"model.share_layers={self.share_layers!r} shares one attention block, but local/global "
                            "layers (model.local_attention) or model.first_attention_norm=False make them differ")

    @property
    def decoder_layers(self) -> int:
        """An encoder-decoder's decoder depth: `num_decoder_layers`, else `num_layers`."""
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    def decoder_config(self) -> "TransformerConfig":
        """The config of an encoder-decoder's decoder stack: `num_layers` is its own depth.

        That includes `residual_scale` (GPT-2's 1/sqrt(2·layers) on the projections into the
        residual stream): the decoder's stream sums its own layers' outputs only (the encoder's
        reach it through cross-attention's keys and values, never added to it), so its own depth
        is what keeps that sum's variance in check, as in GPT-2's argument."""
        return dataclasses.replace(self, num_layers=self.decoder_layers, num_decoder_layers=None)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token table: `vocab_size` rounded up to a multiple of `vocab_multiple`."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def real_logits(self, logits: Array) -> Array:
        """`logits` over the padded table with the padded ids' columns sliced away, so no loss,
        accuracy, argmax or sample ever sees them (the same array when nothing is padded)."""
        return logits if self.padded_vocab_size == self.vocab_size else logits[..., :self.vocab_size]

    @property
    def has_local_layers(self) -> bool:
        """Whether some layer attends within a sliding window (`local_attention`)."""
        return self.local_attention is not None and self.num_layers > 1 and self.global_attn_every_n_layers > 1

    def is_local(self, layer: int) -> bool:
        """Whether layer `layer` attends within the sliding window (ModernBERT: all but every n-th)."""
        return self.local_attention is not None and layer % self.global_attn_every_n_layers != 0

    @property
    def gated(self) -> bool:
        """Whether the feed-forward input is gated by a second projection (`GATED`)."""
        return self.activation in GATED

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def embed_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    def act(self, x: Array) -> Array:
        """The configured non-linearity (for `gated_gelu`, the gate's tanh-GELU; for `geglu`, the erf GELU)."""
        if self.activation == "relu":
            return nn.relu(x)
        return gelu(x) if self.activation in ("gelu", "geglu") else nn.gelu(x, approximate=True)


Extended = TypeVar("Extended", bound=TransformerConfig)


def extend(cfg: TransformerConfig, cls: type[Extended], **fields: Any) -> Extended:
    """`cfg` as `cls`, a family's subclass of TransformerConfig, with the subclass's own `fields` set."""
    return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(TransformerConfig)}, **fields)


def init(cfg: TransformerConfig, names: tuple[str | None, ...], scale: float = 1.0,
         in_axis: int | tuple[int, ...] = -2, out_axis: int | tuple[int, ...] = -1) -> nn.initializers.Initializer:
    """A weight's init, tagged with logical axis names. `bert`: truncated normal with std
    initializer_range · scale everywhere. `fan_in` (Mesh TensorFlow's, which T5 and t5x use): std
    scale / sqrt(fan-in) over the `in_axis` axes, because T5's unscaled attention scores and
    unscaled residual stream rely on it (a 0.02 init leaves them orders of magnitude too small)."""
    if cfg.init_scheme == "fan_in":
        base = nn.initializers.variance_scaling(scale ** 2, "fan_in", "truncated_normal", in_axis=in_axis,
                                                out_axis=out_axis)
    else:
        base = nn.initializers.truncated_normal(stddev=cfg.initializer_range * scale)
    return nn.with_logical_partitioning(base, names)


def embedding_init(cfg: TransformerConfig, names: tuple[str | None, ...]) -> nn.initializers.Initializer:
    """An embedding table's init: `bert` as every weight; `fan_in` a standard normal (Mesh TF's)."""
    if cfg.init_scheme == "fan_in":
        return nn.with_logical_partitioning(nn.initializers.normal(1.0), names)
    return init(cfg, names)


def zeros(names: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones(names: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def residual_scale(cfg: TransformerConfig) -> float:
    """GPT-2's 1/sqrt(2·layers) on the projections that write into the residual stream."""
    return 1.0 / math.sqrt(2 * cfg.num_layers) if cfg.scale_residual_init else 1.0


def dense(cfg: TransformerConfig, features: int, names: tuple[str | None, str | None], name: str,
          scale: float = 1.0) -> nn.Dense:
    """A BERT-initialised Dense layer whose kernel is tagged (input axis, output axis)."""
    return nn.Dense(
        features,
        use_bias=cfg.use_bias,
        kernel_init=init(cfg, names, scale),
        bias_init=zeros(names[1:]),
        dtype=cfg.compute_dtype,
        name=name,
    )


class WrittenOutLayerNorm(nn.Module):
    """flax's LayerNorm (the same parameters, names and output dtype) computed by
    `written_out_layer_norm`. flax takes the variance as E[x²] − E[x]², this one as
    E[(x − E[x])²]: the same function, equal to rounding."""

    epsilon: float
    dtype: Any
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        width = x.shape[-1]
        scale = self.param("scale", ones(("embed",)), (width,))
        bias = self.param("bias", zeros(("embed",)), (width,)) if self.use_bias else jnp.zeros((width,), jnp.float32)
        return written_out_layer_norm(x, scale, bias, self.epsilon, self.dtype)


def layer_norm(cfg: TransformerConfig, name: str) -> nn.Module:
    """The configured norm over `embed` (LayerNorm, with a bias unless `norm_bias=False`, or T5's
    RMSNorm; LayerNorm's backward pass left to autodiff or written out, `norm_backward`)."""
    if cfg.norm_kind == "rmsnorm":
        return nn.RMSNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, scale_init=ones(("embed",)), name=name)
    if cfg.norm_backward == "written_out":
        return WrittenOutLayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, use_bias=cfg.norm_bias, name=name)
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        dtype=cfg.compute_dtype,
        use_bias=cfg.norm_bias,
        scale_init=ones(("embed",)),
        bias_init=zeros(("embed",)),
        name=name,
    )


def gather_positions(sequence: Array, positions: Array) -> Array:
    """[batch, length, d] gathered at [batch, n] positions -> [batch, n, d]."""
    return jnp.take_along_axis(sequence, positions[..., None], axis=1)


def last_real(sequence: Array, mask: Array) -> Array:
    """[batch, length, d] at each row's last position `mask` marks, whichever side the padding is
    on -> [batch, d]: what a causal trunk's summary reads (only that token has read the whole row)."""
    last = jnp.max(jnp.where(mask > 0, jnp.arange(mask.shape[1]), 0), axis=1)
    return gather_positions(sequence, last[:, None])[:, 0]


@flax.struct.dataclass
class Mask:
    """Who may attend to whom, built from the batch; every kind is a restriction of the one before.

    - bidirectional: every query sees every real key (`keys`, the padding mask);
    - packed: and only keys of its own document (`documents`: packing ids, 1, 2, ...);
    - causal: and only keys at or before its own position;
    - prefix: causal, except that every query also sees the first `prefix[b]` keys (T5's prefix LM);
    - per-row kinds (`kinds[b]`, an index into `KINDS`; UniLM's mixed batches, one shared
      network for every row): bidirectional, left-to-right (keys at or before the query),
      right-to-left (keys at or after it) or sequence-to-sequence (every query sees the
      `prefix[b]` source keys, and a target query also the target keys up to itself; a source
      query sees no target). An id outside `KINDS` counts as bidirectional;
    - explicit: and only where `explicit[b, q, k]` is True (XLNet's permutations);
    - sliding window: and only keys at most `window` positions away (on each side; before the
      query only, when causal): the local attention of the long-document encoders.

    Kinds and prefixes are per-row scalars, so no [batch, L, L] array crosses from the host.
    `positions` ([batch, length] int) restricts nothing: it is each token's position, which rotary
    attention (`positions="rotary"`) rotates the queries and keys by; the stack sets it.
    """

    KINDS = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")  # `mask_kind` ids 0..3

    keys: Array  # [batch, keys] bool
    documents: Array | None = None  # [batch, length] int
    prefix: Array | None = None  # [batch] int
    explicit: Array | None = None  # [batch, queries, keys] bool
    kinds: Array | None = None  # [batch] int, indices into KINDS
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    window: int | None = flax.struct.field(pytree_node=False, default=None)  # keys per side; None: no limit
    positions: Array | None = None  # [batch, length] int: rotary attention's token positions (not a restriction)

    @classmethod
    def from_batch(cls, batch: dict[str, Array], causal: bool = False) -> "Mask":
        """The mask a batch asks for: `input_mask`, and `packing_ids`, `prefix_length`,
        `mask_kind`, `explicit_mask` where present. `causal` is the model's own kind (a
        decoder's). Without `mask_kind`, a `prefix_length` makes every row a prefix LM; with it,
        `prefix_length` is the source length of the sequence-to-sequence rows."""
        prefix, kinds = batch.get("prefix_length"), batch.get("mask_kind")
        return cls(keys=batch["input_mask"] > 0, documents=batch.get("packing_ids"), prefix=prefix,
                   explicit=batch.get("explicit_mask"), kinds=kinds,
                   causal=causal or (prefix is not None and kinds is None))

    def lower(self, rows: Array | None = None) -> tuple[Array, bool]:
        """(boolean mask broadcastable to [batch, 1, queries, keys], is_causal) for
        `jax.nn.dot_product_attention`. `rows` ([batch or 1, n]): the queries are those positions
        only (the last layer at the read positions, or the new tokens when decoding with a cache);
        keys still span the sequence.

        A plain causal mask over the full square is left to `is_causal`, so the kernel can skip
        masked blocks without a materialised [batch, 1, L, L] array; other kinds are booleans.
        """
        allowed = self.keys[:, None, None, :]
        if self.documents is not None:
            queries = self.documents if rows is None else jnp.take_along_axis(self.documents, rows, axis=1)
            allowed = allowed & (queries[:, None, :, None] == self.documents[:, None, None, :])
        if self.explicit is not None:
            explicit = self.explicit if rows is None else jnp.take_along_axis(self.explicit, rows[..., None], axis=1)
            allowed = allowed & explicit[:, None]
        if self.kinds is not None:
            allowed = allowed & self._per_row_kinds(rows)[:, None]
        if self.window is not None:
            key_pos = jnp.arange(self.keys.shape[1])
            queries = key_pos[None, :] if rows is None else rows
            allowed = allowed & (jnp.abs(queries[..., None] - key_pos[None, None, :]) <= self.window)[:, None]
        if not self.causal:
            return allowed, False
        prefix = self.prefix if self.kinds is None else None
        if rows is None and prefix is None:
            return allowed, True
        key_pos = jnp.arange(self.keys.shape[1])
        if rows is None:
            rows = key_pos[None, :]
        visible = key_pos[None, None, :] <= rows[..., None]
        if prefix is not None:
            visible = visible | (key_pos[None, None, :] < prefix[:, None, None])
        return allowed & visible[:, None], False

    def fused(self, queries: int, rows: Array | None = None) -> FusedMask:
        """The mask in the fused kernels' vocabulary (`attention.FusedMask`): segment ids for
        padding (real keys 1, padding 0) and packed documents, a causal square; `queries` is the
        number of queries (a cross-attention's differ from its keys). Kinds that are not a
        restriction by segment and a causal square come back without segments and run on xla."""
        for kind, present in (("explicit", self.explicit is not None), ("per-row kinds", self.kinds is not None),
                              ("prefix", self.causal and self.prefix is not None),
                              ("cached decoding", self.causal and rows is not None),
                              ("sliding window at chosen rows", self.window is not None and rows is not None)):
            if present:
                return FusedMask(kind=kind)
        name = " ".join(w for w, on in (("packed", self.documents is not None), ("causal", self.causal),
                                        ("sliding window", self.window is not None)) if on) or "padding"
        if self.documents is None:
            key = self.keys.astype(jnp.int32)
            query = jnp.ones((self.keys.shape[0], queries), jnp.int32)
        else:
            key = jnp.where(self.keys, self.documents, 0).astype(jnp.int32)
            query = (self.documents if rows is None else jnp.take_along_axis(self.documents, rows, axis=1)).astype(jnp.int32)
        return FusedMask(kind=name, query=query, key=key, causal=self.causal, window=self.window)

    def _per_row_kinds(self, rows: Array | None) -> Array:
        """[batch, queries, keys] visibility of each row's kind (see the class docstring)."""
        key_pos = jnp.arange(self.keys.shape[1])
        queries = key_pos[None, :] if rows is None else rows
        before = key_pos[None, None, :] <= queries[..., None]  # left-to-right
        after = key_pos[None, None, :] >= queries[..., None]  # right-to-left
        prefix = jnp.zeros_like(self.kinds) if self.prefix is None else self.prefix
        seq2seq = before | (key_pos[None, None, :] < prefix[:, None, None])
        kind = self.kinds[:, None, None]
        l2r, r2l, s2s = (self.KINDS.index(k) for k in ("left_to_right", "right_to_left", "seq2seq"))
        return jnp.where(kind == l2r, before, jnp.where(kind == r2l, after, jnp.where(kind == s2s, seq2seq, True)))


def rotary(x: Array, positions: Array, theta: float) -> Array:
    """`x` ([batch, length, heads, head_dim]) rotated by its tokens' `positions` ([batch, length]):
    rotary position embeddings (Su et al. 2021, "RoFormer", arXiv 2104.09864) in the "rotate half"
    layout of GPT-NeoX and Hugging Face (`modeling_modernbert.rotate_half`, `apply_rotary_pos_emb`):
    dimension j < d/2 pairs with j + d/2, both turned by the angle position · theta^(-2j/d). So a
    query-key product depends on the two positions only through their difference. Computed in
    float32 (as HF's cos/sin), returned in `x`'s dtype."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [batch, length, d/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # one per head
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


@flax.struct.dataclass
class ScoreTerms:
    """Additive attention-score terms that need each layer's own queries, keys and projections,
    which a fixed `bias` array cannot hold (DeBERTa's content-to-position and position-to-content
    terms project one shared relative-position table through every layer's query and key weights).

    A stack passes it as the layers' `bias`; each self-attention layer then calls
    `fn(inputs, q, k, projections, rows)` with its queries and keys ([batch, length, heads,
    head_dim], q only at `rows` when given), its projection modules (`{"query": ..., "key": ...}`,
    applicable to any [..., hidden] input) and `rows`, and adds the result ([batch or 1, heads,
    queries, keys], already scaled) to the scores. `inputs`: the layer-shared arrays (a pytree).
    `scale`: the q·k scale when the terms change it (DeBERTa's 1/sqrt(3·head width)); None keeps
    the config's. Self-attention without a KV cache only (an encoder's). Nothing here knows which
    family supplies it (`Stack.score_terms`)."""

    inputs: Any
    fn: Any = flax.struct.field(pytree_node=False)
    scale: float | None = flax.struct.field(pytree_node=False, default=None)


class Adapter(nn.Module):
    """Houlsby et al. 2019: a residual bottleneck (down, GELU, up) inserted after a sublayer.

    The up-projection starts at zero, so a freshly added adapter is the identity and fine-tuning
    starts from the pretrained network's function.
    """

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        h = cfg.act(dense(cfg, cfg.adapter_size, ("embed", "mlp"), "down")(x))
        up = nn.Dense(
            cfg.hidden_size,
            kernel_init=zeros(("mlp", "embed")),
            bias_init=zeros(("embed",)),
            dtype=cfg.compute_dtype,
            name="up",
        )
        return x + up(h)


def hash32(x: Array) -> Array:
    """lowbias32 (C. Wellons's integer-hash search): a bijection of uint32 whose output bits each
    flip with probability ~1/2 when any input bit flips."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


class Dropout(nn.Module):
    """Inverted dropout whose draws are a keyed hash of each element's index, not threefry's.

    Why: XLA:CPU spends ~20 ns per threefry word, so the [batch, heads, L, L] attention
    probabilities of GPT-2 at 1024 tokens (12M elements a layer) cost 0.26 CPU-s of random bits
    per layer, ~15% of a train step; the hash below costs ~1 ns a word and fuses into its consumer.
    The key is two threefry words from the module's `dropout` rng, so each call (layer, step,
    microbatch) draws its own mask; the hash is applied twice with them, so two keys give
    unrelated streams, not shifted copies. Each 32-bit word gives two 16-bit draws and an element
    is dropped when its draw is below round(rate · 2^16): the rate is kept to within 2^-17 and the
    kept elements are scaled by 2^16 / (2^16 - threshold), so the expectation is exact. The draw
    depends on the element's index in the whole array only, so a sharded array gets the same mask
    (indices are 32-bit: an array of more than 2^33 elements would repeat its mask).
    """

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0:
            return jnp.zeros_like(x)
        k0, k1 = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
        pairs = x.ndim > 0 and x.shape[-1] % 2 == 0
        shape = (*x.shape[:-1], x.shape[-1] // 2) if pairs else x.shape
        index = jnp.zeros(shape, jnp.uint32)
        for axis, stride in enumerate(math.prod(shape[a + 1:]) for a in range(len(shape))):
            index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        words = hash32(hash32(index ^ k0) + k1)
        draws = (jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(x.shape).astype(jnp.uint32) if pairs
                 else words >> 16)
        threshold = round(self.rate * 2 ** 16)
        keep = draws >= jnp.uint32(threshold)
        return jnp.where(keep, x * jnp.asarray(2 ** 16 / (2 ** 16 - threshold), x.dtype), jnp.zeros((), x.dtype))


def sublayer_output(cfg: TransformerConfig, x: Array, out: Array, norm: nn.Module, deterministic: bool,
                    parallel: Array | None = None) -> Array:
    """Dropout, optional adapter, residual, and (post-LN) the norm: how every sublayer ends.
    `parallel` (a layer's parallel branch, `Stack.run`) joins the residual sum, inside the norm."""
    out = Dropout(cfg.dropout_rate)(out, deterministic=deterministic)
    if cfg.adapter_size:
        out = Adapter(cfg, name="adapter")(out)
    residual = x if parallel is None else x + parallel
    return norm(residual + out) if cfg.norm == "post" else residual + out


class HeadsDense(nn.Module):
    """Dense layer into (`to_heads`) or out of the [heads, kv] layout, kernel kept 3-D.

    flax's DenseGeneral initialises a flattened 2-D kernel and reshapes it, which clashes with the
    3-D logical axis names once a mesh is active, so the kernel is declared 3-D, one name per
    axis. The product runs as one 2-D matrix product over the flattened tokens and the merged
    (heads, kv) axis: written as a 3-D einsum its gradients contract two axes at once, which made
    a BART-base train step ~5% slower on XLA:CPU (T5-small's measured the same either way;
    benchmarks/train_step_seq2seq, numbers in the README).
    """

    cfg: TransformerConfig
    to_heads: bool
    scale: float = 1.0

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        heads = (cfg.num_heads, cfg.head_dim)
        if self.to_heads:
            shape, names, axes = (cfg.hidden_size, *heads), ("embed", "heads", "kv"), (0, (1, 2))
            out_shape, bias_names = heads, ("heads", "kv")
        else:
            shape, names, axes = (*heads, cfg.hidden_size), ("heads", "kv", "embed"), ((0, 1), 2)
            out_shape, bias_names = (cfg.hidden_size,), ("embed",)
        kernel = self.param("kernel", init(cfg, names, self.scale, *axes), shape)
        bias = self.param("bias", zeros(bias_names), out_shape) if cfg.use_bias else None
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.compute_dtype)
        contracted = len(shape) - len(out_shape)  # x's trailing axes the kernel takes: 1 or 2
        width = math.prod(shape[:contracted])
        y = (x.reshape(-1, width) @ kernel.reshape(width, -1)).reshape(*x.shape[:-contracted], *out_shape)
        return y if bias is None else y + bias


def _heads_first(x: Array) -> Array:
    """[batch, length, heads, head_dim] <-> [batch, heads, length, head_dim]: the KV cache's layout."""
    return jnp.swapaxes(x, 1, 2)


class Attention(nn.Module):
    """Multi-head scaled dot-product attention (self-, or cross- with `context`), with the residual
    and the norm (before the sublayer or after the residual, per `cfg.norm`).

    The softmax attention itself is `attention.attend`, shared by every family: fused without
    attention dropout (evaluation, or a rate of 0), written out with it (the hashed `Dropout`).
    `rows` ([batch, n] positions), when given, computes queries and outputs at those positions
    only; keys and values still cover the whole sequence, so each output row is exactly the one
    the full layer would give there. `bias` ([1 or batch, heads, queries, keys]) is added to the
    scores (T5's relative positions); a `ScoreTerms` instead computes that addition from this
    layer's queries, keys and projections (DeBERTa's disentangled attention).

    `decode=True` keeps keys and values in the `cache` collection, so incremental decoding feeds
    one new token per call: self-attention appends the new keys at the cache index; cross-attention
    computes the context's keys once and reuses them. Initialise the cache by calling the model
    with `decode=True` on inputs of the full length (flax's `init` with mutable `cache`).

    Applied with the `intermediates` collection mutable, it also sows its pre-softmax scores and
    their softmax (`attention.sow`: `scores` for attention distillation, `probs` for attention
    maps); without it neither is computed.

    `local`: this layer's self-attention sees only the keys at most `cfg.local_attention // 2`
    positions away (the mask's `window`) and rotates by `cfg.local_rope_theta`; `pre_norm=False`:
    pre-LN without the norm before the sublayer (ModernBERT's first layer). With
    `positions="rotary"` the self-attention's queries and keys are rotated by the mask's positions
    (`rotary`) before the scores; cross-attention's are not. With `cfg.sparse_block_size` the
    self-attention of a row long enough for the pattern is BigBird's block-sparse one
    (`block_sparse`, `_block_sparse`), queries at every position and `rows` read off its output.
    """

    cfg: TransformerConfig
    local: bool = False
    pre_norm: bool = True

    @nn.compact
    def __call__(self, x: Array, mask: Mask, bias: Array | ScoreTerms | None, deterministic: bool, rows: Array | None = None,
                 context: Array | None = None, decode: bool = False) -> Array:
        cfg = self.cfg
        norm = layer_norm(cfg, "norm") if cfg.norm == "post" or self.pre_norm else (lambda y: y)
        x_all = x
        h_all = norm(x_all) if cfg.norm == "pre" else x_all
        if rows is not None:
            x = gather_positions(x_all, rows)
        sparse = (cfg.sparse_block_size is not None and context is None and not decode
                  and not block_sparse.too_short(x_all.shape[1], cfg.sparse_block_size, cfg.num_random_blocks))
        if sparse:  # block-sparse queries run everywhere; the chosen rows are read off its output
            rows, sparse_rows = None, rows
        h = h_all if rows is None else gather_positions(h_all, rows)
        # T5's init folds the 1/sqrt(head width) it leaves out of the scores into the queries
        query_scale = cfg.head_dim ** -0.5 if cfg.init_scheme == "fan_in" and not cfg.scale_attention else 1.0
        query = HeadsDense(cfg, to_heads=True, scale=query_scale, name="query")
        q = query(h)
        key, value = HeadsDense(cfg, to_heads=True, name="key"), HeadsDense(cfg, to_heads=True, name="value")
        terms = bias if isinstance(bias, ScoreTerms) else None
        bias = None if terms is not None else bias
        if terms is not None and (decode or context is not None):
            raise ValueError("ScoreTerms apply to self-attention without a KV cache (an encoder's)")
        if bias is not None and rows is not None:  # the chosen queries' rows of the bias
            bias = jnp.take_along_axis(jnp.broadcast_to(bias, (q.shape[0], *bias.shape[1:])),
                                       rows[:, None, :, None], axis=2)
        if context is not None:
            k, v, mask = self._cross_keys(key, value, context, mask, decode)
        else:
            k, v = key(h_all), value(h_all)
            if cfg.positions == "rotary":
                if mask.positions is None:
                    raise ValueError("positions='rotary' needs the token positions on the mask (Stack.run sets them)")
                theta = cfg.rope_theta
                if self.local and cfg.local_rope_theta is not None:
                    theta = cfg.local_rope_theta
                q_pos = mask.positions if rows is None else jnp.take_along_axis(mask.positions, rows, axis=1)
                q, k = rotary(q, q_pos, theta), rotary(k, mask.positions, theta)
            if self.local:
                mask = mask.replace(window=cfg.local_attention // 2)
            if decode:  # the queries are the positions after the cached ones
                k, v, mask, start = self._append_to_cache(k, v, mask)
                rows = start + jnp.arange(q.shape[1])[None, :]
        allowed, is_causal = mask.lower(rows)
        scale = None if cfg.scale_attention else 1.0
        if terms is not None:  # a family's score terms from this layer's queries, keys and projections
            bias = terms.fn(terms.inputs, q, k, {"query": query, "key": key}, rows)
            scale = terms.scale if terms.scale is not None else scale
        sow_attention(self, q, k, allowed, is_causal, bias, scale, probs=not sparse)
        dropout = None
        if not (deterministic or cfg.attention_dropout_rate == 0.0):  # dropout needs the written-out softmax
            drop = Dropout(cfg.attention_dropout_rate)
            dropout = lambda probs: drop(probs.astype(q.dtype), deterministic=False)  # noqa: E731
        # a sliding window goes to the kernels' vocabulary on xla too: `attend` runs it banded, O(L · window)
        fused = GENERAL if cfg.attention_backend == "xla" and mask.window is None else mask.fused(q.shape[1], rows)
        if sparse:  # BigBird's pattern: its own gathered products instead of `attend` (no probability dropout)
            ctx = self._block_sparse(q, k, v, mask, bias, scale, deterministic, sparse_rows)
        else:
            ctx = attend(q, k, v, allowed=allowed, is_causal=is_causal, bias=bias, scale=scale, dropout=dropout,
                         backend=cfg.attention_backend, fused=fused)
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))
        out = HeadsDense(cfg, to_heads=False, scale=residual_scale(cfg), name="output")(ctx)
        return sublayer_output(cfg, x, out, norm, deterministic)

    def _block_sparse(self, q: Array, k: Array, v: Array, mask: Mask, bias: Array | None, scale: float | None,
                      deterministic: bool, rows: Array | None) -> Array:
        """BigBird's block-sparse attention (`block_sparse.attend`) over the whole row, read at
        `rows` when given: HF's evaluation table of random blocks when `deterministic`, else a
        fresh draw from the `dropout` rng. Padding is its only mask kind; no probability dropout
        (HF's block-sparse attention has none)."""
        cfg = self.cfg
        if bias is not None or mask.causal or any(m is not None for m in (mask.documents, mask.explicit, mask.kinds)):
            raise UserError("block-sparse attention (model.sparse_block_size) takes padding only: no score bias, "
                            "causal, packed, per-row or explicit masks")
        block, r, heads = cfg.sparse_block_size, cfg.num_random_blocks, q.shape[2]
        n = -(-q.shape[1] // block)
        random = (block_sparse.eval_random_blocks(heads, n, r) if deterministic
                  else block_sparse.draw_random_blocks(self.make_rng("dropout"), heads, n, r))
        ctx = block_sparse.attend(q, k, v, mask.keys, block=block, random=random, scale=scale)
        return ctx if rows is None else jnp.take_along_axis(ctx, rows[:, :, None, None], axis=1)

    def _cross_keys(self, key: nn.Module, value: nn.Module, context: Array, mask: Mask,
                    decode: bool) -> tuple[Array, Array, Mask]:
        """The context's keys, values and mask; when decoding, computed at the first call and
        cached (later calls may pass an empty context), heads first like the self-attention
        cache, so that no step copies them into the layout the attention products contract in."""
        if not decode:
            return key(context), value(context), mask
        k = self.variable("cache", "cached_key", lambda: _heads_first(key(context)))
        v = self.variable("cache", "cached_value", lambda: _heads_first(value(context)))
        keys = self.variable("cache", "key_mask", lambda: mask.keys)
        return _heads_first(k.value), _heads_first(v.value), mask.replace(keys=keys.value)

    def _append_to_cache(self, k: Array, v: Array, mask: Mask) -> tuple[Array, Array, Mask, Array]:
        """Write this call's keys/values (and key padding) at the cache index; return the whole cache.

        The cache is kept [batch, heads, slots, head_dim], the layout the attention products
        contract in (batch and heads leading), and handed back as a transposed view that XLA
        folds into those products: kept [batch, slots, heads, head_dim] instead, every decoding
        step copied each layer's whole cache into that layout (on XLA:CPU 24 copies of the
        cache per step for GPT-2 small), where the new token's keys are tiny to transpose."""
        creating = not self.has_variable("cache", "cached_key")
        cached_k = self.variable("cache", "cached_key", lambda: jnp.zeros(_heads_first(k).shape, k.dtype))
        cached_v = self.variable("cache", "cached_value", lambda: jnp.zeros(_heads_first(v).shape, v.dtype))
        cached_keys = self.variable("cache", "key_mask", jnp.zeros, mask.keys.shape, bool)
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        if creating:  # the init call: shapes only, the cache stays empty
            return k, v, mask, jnp.zeros((), jnp.int32)
        start = index.value
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, _heads_first(k).astype(cached_k.value.dtype),
                                                      (0, 0, start, 0))
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, _heads_first(v).astype(cached_v.value.dtype),
                                                      (0, 0, start, 0))
        cached_keys.value = jax.lax.dynamic_update_slice(cached_keys.value, mask.keys, (0, start))
        index.value = start + k.shape[1]
        mask = mask.replace(keys=cached_keys.value, documents=None)
        return _heads_first(cached_k.value), _heads_first(cached_v.value), mask, start


class FeedForward(nn.Module):
    """Position-wise MLP (gated for `gated_gelu` and `geglu`), with the residual and the norm."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool, parallel: Array | None = None) -> Array:
        cfg = self.cfg
        norm = layer_norm(cfg, "norm")
        inputs = norm(x) if cfg.norm == "pre" else x
        h = cfg.act(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(inputs))
        if cfg.gated:
            h = h * dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate_linear")(inputs)
        if cfg.activation_dropout_rate:
            h = Dropout(cfg.activation_dropout_rate)(h, deterministic=deterministic)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output", scale=residual_scale(cfg))(h)
        return sublayer_output(cfg, x, h, norm, deterministic, parallel)


def _remat(module_cls: type[nn.Module], policy: str, static_argnums: tuple[int, ...]) -> type[nn.Module]:
    """Rematerialised `module_cls`; `static_argnums` index its Python-valued arguments counting
    `self` as 0 (flax's convention), so they stay static."""
    if policy == "none":
        return module_cls
    checkpoint_policy = (
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable if policy == "dots_saveable" else None
    )
    return nn.remat(module_cls, policy=checkpoint_policy, static_argnums=static_argnums)


# Python-valued arguments: Attention (self, x, mask, bias, deterministic, rows, context, decode),
# FeedForward (self, x, deterministic), Layer (self, x, mask, bias, deterministic, context, context_mask, decode).
_ATTENTION_STATIC, _FFN_STATIC, _LAYER_STATIC = (4, 7), (2,), (4, 7)


class Layer(nn.Module):
    """One block: self-attention, cross-attention to `context` (decoders of an encoder-decoder),
    feed-forward. The unit `nn.scan` repeats when `scan_layers` is on."""

    cfg: TransformerConfig
    cross: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: Mask, bias: Array | ScoreTerms | None, deterministic: bool,
                 context: Array | None, context_mask: Mask | None, decode: bool) -> tuple[Array, Array]:
        cfg = self.cfg
        x = Attention(cfg, name="attention")(x, mask, bias, deterministic, None, None, decode)
        if self.cross:
            x = Attention(cfg, name="cross_attention")(x, context_mask, None, deterministic, None, context, decode)
        x = FeedForward(cfg, name="ffn")(x, deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x, x


def relative_bucket(relative: Array, bidirectional: bool, buckets: int, max_distance: int) -> Array:
    """T5's bucket of each (key - query) offset: exact buckets for small offsets, then buckets
    growing logarithmically up to `max_distance`; the two directions get half the buckets each
    when `bidirectional`, and a causal stack only sees the past."""
    n = -relative
    bucket = jnp.zeros_like(n)
    if bidirectional:
        buckets //= 2
        bucket = jnp.where(n < 0, buckets, 0)
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    exact = buckets // 2
    large = exact + (jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / exact)
                     / math.log(max_distance / exact) * (buckets - exact)).astype(n.dtype)
    large = jnp.minimum(large, buckets - 1)
    return bucket + jnp.where(n < exact, n, large)


class RelativePositionBias(nn.Module):
    """T5's learned scalar per (bucket, head), added to every layer's attention scores.

    When decoding, the cache keeps the next query position and the key slots, so each call's
    rows are those of its new positions against every slot (the cache-creating call fixes the
    number of slots).
    """

    cfg: TransformerConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, length: int, decode: bool = False) -> Array:
        """The bias [1, heads, queries, keys] for `length` new positions."""
        cfg = self.cfg
        table = self.param("embedding", init(cfg, (None, "heads")), (cfg.relative_buckets, cfg.num_heads))
        queries = keys = jnp.arange(length)
        if decode:
            creating = not self.has_variable("cache", "position")
            position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
            slots = self.variable("cache", "slots", lambda: jnp.arange(length))
            if not creating:
                queries, keys = position.value + queries, slots.value
                position.value = position.value + length
        bucket = relative_bucket(keys[None, :] - queries[:, None], self.bidirectional,
                                 cfg.relative_buckets, cfg.relative_max_distance)
        return jnp.transpose(table[bucket], (2, 0, 1))[None].astype(cfg.compute_dtype)


def sinusoid(positions: Array, dim: int) -> Array:
    """[...] (float) positions -> [..., dim]: sines then cosines at the frequencies of Vaswani et
    al. 2017 (§3.5), 1 / 10000^(2i/dim), in the two halves as tensor2tensor's timing signal and
    Transformer-XL's relative encodings lay them out (the paper interleaves them: the same
    vectors, their dimensions permuted)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0.0, dim, 2.0) / dim))
    angles = positions[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class Embeddings(nn.Module):
    """Token + absolute position (learned, or `positions="sinusoidal"`: fixed sinusoids, no
    parameters) + segment embeddings (each optional but the first), LayerNorm (optional), dropout.

    With `embedding_size` set (ALBERT, ELECTRA) the sum lives in E dimensions; the stack then
    projects it to its own H, so one table can serve two stacks of different widths.
    `shared_tokens`: another module's token table, used instead of an own one (BART's decoder
    shares only the token table with its encoder, and keeps its own positions and norm).
    """

    cfg: TransformerConfig
    shared_tokens: nn.Embed | None = None

    def setup(self):
        cfg = self.cfg
        embed = functools.partial(nn.Embed, features=cfg.embed_dim, dtype=cfg.compute_dtype)
        if self.shared_tokens is None:
            self.token = embed(cfg.padded_vocab_size, embedding_init=embedding_init(cfg, ("vocab", "embed")), name="token")
        else:
            self.token = self.shared_tokens
        if cfg.positions == "absolute":
            self.position = embed(
                cfg.max_position_embeddings, embedding_init=embedding_init(cfg, (None, "embed")), name="position"
            )
        if cfg.type_vocab_size:
            self.segment = embed(cfg.type_vocab_size, embedding_init=embedding_init(cfg, (None, "embed")), name="segment")
        if cfg.embedding_norm:
            self.norm = layer_norm(cfg, "norm")
        self.dropout = Dropout(cfg.dropout_rate)

    def __call__(self, input_ids: Array, segment_ids: Array, positions: Array, deterministic: bool) -> Array:
        cfg = self.cfg
        x = self.token(input_ids)
        if cfg.scale_embeddings:
            x = x * jnp.sqrt(cfg.embed_dim).astype(x.dtype)
        if cfg.positions == "absolute":
            x = x + self.position(positions)
        elif cfg.positions == "sinusoidal":
            x = x + sinusoid(positions.astype(jnp.float32), cfg.embed_dim).astype(x.dtype)
        if cfg.type_vocab_size:
            x = x + (self.segment(segment_ids) if jax.default_backend() == "cpu"
                     else one_hot_lookup(self.segment.embedding.astype(x.dtype), segment_ids))
        if cfg.embedding_norm:
            x = self.norm(x)
        return self.dropout(x, deterministic=deterministic)

    def attend(self, x: Array) -> Array:
        """Logits against the token table: the output layer tied to the input embeddings. Over
        the padded table (`padded_vocab_size` columns): the caller adds any bias, then
        `cfg.real_logits`."""
        return self.token.attend(x)


def one_hot_lookup(table: Array, ids: Array) -> Array:
    """table[ids] as a one-hot product: the same values (one nonzero term per output), but the
    table's gradient becomes a small matmul instead of a scatter-add. For the segment table (2
    rows) that scatter sends every token's gradient into the same 2 rows, which GPUs serialise:
    on one H100 it was half of BERT-base's step (14 of 26 ms at 32×128, 30 of 59 ms at 32×512,
    `benchmarks.accelerator --profile`). CPUs scatter fast, so the CPU path keeps the gather
    (and its exact gradient summation order)."""
    return jnp.einsum("...t,te->...e", jax.nn.one_hot(ids, table.shape[0], dtype=table.dtype), table)


def inputs(batch: dict[str, Array]) -> tuple[Array, Array, Array]:
    """(input_ids, segment_ids, positions) of a batch: the one place the model reads its inputs.
    Missing segments are 0; missing positions count from 0 along each row."""
    ids = batch["input_ids"]
    segments = batch.get("segment_ids")
    positions = batch.get("positions")
    if segments is None:
        segments = jnp.zeros_like(ids)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(ids.shape[-1]), ids.shape)
    return ids, segments, positions


class Stack(nn.Module):
    """Embeddings, N layers (self-attention, optional cross-attention, feed-forward), and for
    pre-LN the final norm: the common body of `Encoder` and `Decoder`, which subclass it so that
    their parameters sit directly under their own name (`encoder/attention_0/...`).

    Layer sharing (`share_layers`) decides how many attention and feed-forward blocks exist:
    one shared instance applied N times, or N distinct ones (`attention_{i}`, `ffn_{i}`,
    `cross_attention_{i}`); with `scan_layers` the N layers are one `layers` module whose
    parameters carry a leading `layers` axis. `shared_embeddings` lets a stack use another's
    tables (ELECTRA's generator, T5's decoder); it then owns no embeddings. `shared_tokens`
    shares only the token table (BART's decoder: own positions and embedding norm).

    `outputs_at` ([batch, n] positions) is for callers that read the final states only at a few
    positions, as the MLM head does at the masked ones: the last layer then runs its queries,
    residual and feed-forward block only there (keys and values still span the sequence), and
    the last entry of `layers` is [batch, n, H] at those positions, equal to gathering them from
    the full output. At 128 tokens and 20 predictions this skips 5.6% of BERT-base's training
    FLOPs and 13% of BERT-mini's. A scanned stack runs the full last layer and gathers.
    """

    cfg: TransformerConfig
    shared_embeddings: Embeddings | None = None
    shared_tokens: nn.Embed | None = None
    causal: bool = False
    cross: bool = False

    def setup(self):
        cfg = self.cfg
        if self.shared_embeddings is None:
            self.embeddings = Embeddings(cfg, shared_tokens=self.shared_tokens, name="embeddings")
        else:
            self.embeddings = self.shared_embeddings
        if cfg.embedding_size is not None:
            self.embeddings_projection = dense(cfg, cfg.hidden_size, ("embed", "hidden"), "embeddings_projection")
        if cfg.positions == "relative_bias":
            self.relative_bias = RelativePositionBias(cfg, bidirectional=not self.causal, name="relative_bias")
        n = cfg.num_layers
        if cfg.scan_layers:
            layer = _remat(Layer, cfg.remat, _LAYER_STATIC)
            self.layers = nn.scan(
                layer,
                variable_axes={"params": 0, "cache": 0, "intermediates": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * 6,
                length=n,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )(cfg, cross=self.cross, name="layers")
        else:
            n_attn = 1 if cfg.share_layers in ("all", "attention") else n
            n_ffn = 1 if cfg.share_layers in ("all", "ffn") else n
            attn_cls = _remat(Attention, cfg.remat, _ATTENTION_STATIC)
            ffn_cls = _remat(FeedForward, cfg.remat, _FFN_STATIC)
            self.attention = [attn_cls(cfg, local=cfg.is_local(i), pre_norm=i > 0 or cfg.first_attention_norm,
                                       name=f"attention_{i}") for i in range(n_attn)]
            if self.cross:
                self.cross_attention = [attn_cls(cfg, name=f"cross_attention_{i}") for i in range(n_attn)]
            self.ffn = [ffn_cls(cfg, name=f"ffn_{i}") for i in range(n_ffn)]
        if cfg.norm == "pre":
            self.final_norm = layer_norm(cfg, "final_norm")

    def run(self, batch: dict[str, Array], deterministic: bool, outputs_at: Array | None = None,
            context: Array | None = None, context_mask: Mask | None = None, decode: bool = False,
            parallel: Parallel | None = None) -> list[Array]:
        """Every layer's output, the embedding output first (the last one after the final norm).

        `parallel` is a branch beside every layer: `parallel(i, x, mask, deterministic)`, a function of
        layer i's input x, is added to the layer's last residual sum, inside its norm (post-LN:
        LN(a + FFN(a) + parallel(x)), a the attention sublayer's output). A module bound to the caller
        keeps its parameters there (a task's projected attention layers, `bertology.models.pals`)."""
        cfg = self.cfg
        if parallel is not None and cfg.scan_layers:
            raise UserError("a per-layer parallel branch needs distinct layers; set model.scan_layers=False")
        ids, segments, positions = inputs(batch)
        x = self.embeddings(ids, segments, positions + cfg.position_offset, deterministic)
        if cfg.embedding_size is not None:
            x = self.embeddings_projection(x)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        mask = Mask.from_batch(batch, causal=self.causal)
        if cfg.positions == "rotary":
            mask = mask.replace(positions=positions)
        bias: Any = (self.relative_bias(ids.shape[1], decode) if cfg.positions == "relative_bias"
                     else self.score_terms(positions, deterministic))
        if cfg.scan_layers:
            last, states = self.layers(x, mask, bias, deterministic, context, context_mask, decode)
            layers = [x, *(states[i] for i in range(cfg.num_layers - 1)), last]
            if outputs_at is not None:
                layers[-1] = gather_positions(last, outputs_at)
        else:
            layers = [x]
            for i in range(cfg.num_layers):
                rows = outputs_at if i == cfg.num_layers - 1 else None
                branch = None if parallel is None else parallel(i, x, mask, deterministic)
                if branch is not None and rows is not None:
                    branch = gather_positions(branch, rows)
                x = self.attention[i % len(self.attention)](x, mask, bias, deterministic, rows, None, decode)
                if self.cross:
                    x = self.cross_attention[i % len(self.cross_attention)](
                        x, context_mask, None, deterministic, None, context, decode)
                x = self.ffn[i % len(self.ffn)](x, deterministic, branch)
                x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
                layers.append(x)
        if cfg.norm == "pre":
            layers[-1] = self.final_norm(layers[-1])
        return layers

    def score_terms(self, positions: Array, deterministic: bool) -> ScoreTerms | None:
        """The self-attention layers' extra score terms (`ScoreTerms`) for tokens at `positions`
        ([batch, length]); None here. A subclass that owns layer-shared position parameters
        returns them (DeBERTa's disentangled attention)."""
        return None

    def attend(self, x: Array) -> Array:
        """Logits against the token table: the output layer tied to the input embeddings."""
        return self.embeddings.attend(x)


def stack_layers(stack_params: dict, num_layers: int | None = None) -> dict:
    """A stack's unscanned parameters in the scanned layout: `attention_{i}`, `cross_attention_{i}`
    and `ffn_{i}` become `layers/attention` (...) with a leading axis of length `num_layers`: the
    same parameters in the other layout, which the tests compare the layouts with (a run's
    checkpoint loads into its own layout only). `num_layers`: the stack's own depth (an
    encoder-decoder's decoder: `cfg.decoder_layers`); None counts the stack's `attention_{i}`,
    and a depth other than that count is refused (it would drop or miss layers)."""
    blocks = [b for b in ("attention", "cross_attention", "ffn") if f"{b}_0" in stack_params]
    depth = sum(1 for k in stack_params if k.startswith("attention_") and k[len("attention_"):].isdigit())
    if num_layers is None:
        num_layers = depth
    elif num_layers != depth:
        raise ValueError(f"stack_layers: num_layers={num_layers}, but the stack has {depth} layers")
    out = {k: v for k, v in stack_params.items() if not any(k.startswith(f"{b}_") for b in blocks)}
    out["layers"] = {b: jax.tree.map(lambda *xs: jnp.stack(xs), *(stack_params[f"{b}_{i}"] for i in range(num_layers)))
                     for b in blocks}
    return out


def with_first(outputs_at: Array) -> Array:
    """`outputs_at` with position 0 in front: the encoder's last layer also runs at the first
    token, which `pooled` reads."""
    return jnp.concatenate([jnp.zeros_like(outputs_at[:, :1]), outputs_at], axis=1)


class Encoder(Stack):
    """A bidirectional stack and the pooler (BERT's trunk). Returns `sequence` (the last layer),
    `pooled` (the first token, through dense+tanh when `pooler`), and every layer's output.

    With `outputs_at`, `sequence` is [batch, n, H] at those positions (see `Stack`); `pooled`
    still reads the first token. `parallel`: a branch beside every layer (`Stack.run`).
    """

    def setup(self):
        super().setup()
        if self.cfg.pooler:
            self.pooler = dense(self.cfg, self.cfg.hidden_size, ("embed", "hidden"), "pooler")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 outputs_at: Array | None = None, parallel: Parallel | None = None) -> dict[str, Array]:
        rows = None if outputs_at is None else with_first(outputs_at)
        layers = self.run(batch, deterministic, outputs_at=rows, parallel=parallel)
        x = layers[-1]
        first = x[:, 0]
        if outputs_at is not None:
            x = layers[-1] = x[:, 1:]
        pooled = jnp.tanh(self.pooler(first)) if self.cfg.pooler else first
        return {"sequence": x, "pooled": pooled, "layers": layers}


class Decoder(Stack):
    """A causal stack (GPT's trunk; with `cross`, an encoder-decoder's decoder). Returns the last
    layer's states [batch, length, H] and every layer's output. `decode=True` runs incrementally
    against the KV cache (see `Attention`)."""

    causal: bool = True

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True, context: Array | None = None,
                 context_mask: Mask | None = None, decode: bool = False) -> dict[str, Array]:
        layers = self.run(batch, deterministic, context=context, context_mask=context_mask, decode=decode)
        return {"sequence": layers[-1], "layers": layers}


def shift_right(ids: Array, start_id: int) -> Array:
    """Decoder inputs for teacher forcing: `start_id`, then the targets without their last token."""
    return jnp.concatenate([jnp.full_like(ids[:, :1], start_id), ids[:, :-1]], axis=1)


class EncoderDecoder(nn.Module):
    """An encoder and a cross-attending decoder sharing one token table (BART, T5, MASS). The
    decoder has `cfg.decoder_layers` layers (`num_decoder_layers`, else as many as the encoder).

    `encode(batch)` reads `input_ids`/`input_mask`; `decode(batch, encoded, encoder_mask)` reads
    `decoder_input_ids`/`decoder_input_mask` (and `decoder_positions`). Family models subclass it
    and add their output layer on the decoder states (`attend`: tied to the shared table).
    `decoder_embeddings`: the decoder has its own position table and embedding norm and shares
    only the token table (BART); otherwise it shares the encoder's embeddings whole (T5, whose
    embeddings are the token table alone).

    Incremental decoding (`decode=True` on the call): the first call creates the cache from a
    batch with the source (`input_ids`, `input_mask`) and a decoder input of the full target
    length; it runs the encoder once, caches each layer's cross-attention keys, values and source
    mask, and returns the teacher-forced states of that input while leaving the self-attention
    cache empty. Later calls carry no source, only the new decoder tokens (`decoder_input_ids`,
    `decoder_input_mask`, and for learned positions `decoder_positions`): the encoder never runs
    again.
    """

    cfg: TransformerConfig
    decoder_embeddings: bool = False
    # The token decoding starts from where the run's data name none (`generation.decoder_start_id`):
    # the pad id, as T5. A class constant (no annotation), not a module field.
    decoder_start = "pad"

    def setup(self):
        cfg = dataclasses.replace(self.cfg, pooler=False)
        self.encoder = Encoder(cfg, name="encoder")
        decoder = cfg.decoder_config()  # its own depth (`num_decoder_layers`), the rest shared
        if self.decoder_embeddings:
            self.decoder = Decoder(decoder, cross=True, shared_tokens=self.encoder.embeddings.token, name="decoder")
        else:
            self.decoder = Decoder(decoder, cross=True, shared_embeddings=self.encoder.embeddings, name="decoder")

    def encode(self, batch: dict[str, Array], *, deterministic: bool = True) -> Array:
        return self.encoder(batch, deterministic=deterministic)["sequence"]

    def decode(self, batch: dict[str, Array], encoded: Array, encoder_mask: Array, *, deterministic: bool = True,
               decode: bool = False) -> Array:
        target = {"input_ids": batch["decoder_input_ids"], "input_mask": batch["decoder_input_mask"]}
        if "decoder_positions" in batch:
            target["positions"] = batch["decoder_positions"]
        context_mask = Mask(keys=encoder_mask > 0)
        return self.decoder(target, deterministic=deterministic, context=encoded, context_mask=context_mask,
                            decode=decode)["sequence"]

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True, decode: bool = False) -> Array:
        """Decoder states [batch, target length, H]: under teacher forcing, or (`decode`) for the
        new tokens against the cache (see the class docstring)."""
        if "input_ids" in batch:
            encoded = self.encode(batch, deterministic=deterministic)
            return self.decode(batch, encoded, batch["input_mask"], deterministic=deterministic, decode=decode)
        if not decode:
            raise UserError("an encoder-decoder batch needs input_ids (the source); only decode=True steps "
                            "after the cache-creating call may leave it out")
        # the cross-attention keys, values and source mask are cached: the context only has to be present
        rows = batch["decoder_input_ids"].shape[0]
        empty = jnp.zeros((rows, 0, self.cfg.hidden_size), self.cfg.compute_dtype)
        return self.decode(batch, empty, jnp.zeros((rows, 0), jnp.int32), deterministic=deterministic, decode=True)

    def attend(self, x: Array) -> Array:
        return self.encoder.attend(x)
