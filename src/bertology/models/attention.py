"""The one softmax attention every family runs through: `attend`, on one of several backends.

Families differ in how they project queries, keys and values and in what they add to q·k (T5's
bucket bias, Transformer-XL's and XLNet's position, content-bias and segment terms), never in
the softmax attention itself. So that part lives here once, and a faster backend replaces it in
one place for every family.

The score-term hook is `bias`: a family's extra terms arrive as one additive [1|batch, heads,
queries, keys] array, already multiplied by whatever the family scales them with, so that the
softmax runs over `scale · q·k + bias`. Keeping the extra terms out of q·k lets a fused kernel
still do the big product, and an additive bias is what those kernels accept.

Backends (`model.attention_backend`; `choose` is the whole rule, a pure function):
- `xla`: `jax.nn.dot_product_attention`'s XLA path over a boolean mask, every mask kind; a
  sliding window over segment ids runs `banded` instead (O(length · window), not the square). With
  dropout on the probabilities the softmax is written out (no kernel drops them), a causal square
  in blocks of queries; the dropout is the caller's own callable, so each family keeps its random
  stream (the core's hashed `Dropout`, XL's and XLNet's flax `nn.Dropout`).
- `cudnn`: cuDNN's fused flash attention (NVIDIA GPUs, bfloat16/float16). Padding becomes key
  lengths, a causal square `is_causal` and a causal sliding window cuDNN's window, so no
  [batch, 1, L, L] array is read; packed documents, a two-sided window and the other kinds go in
  as a boolean mask, which cuDNN reads as an additive bias (JAX's internal packed layout, segment
  offsets and lengths, gave wrong gradients on an H100 with jax 0.11.2 / cuDNN 9.19 while its
  forward pass was right, so it is not used).
- `splash`: the Pallas TPU splash-attention kernel; padding and packed documents become segment
  ids, a causal square and a sliding window its mask objects (whose empty blocks it skips). It
  has no bias and no per-row masks. Off TPU it runs in Pallas interpret mode, which is how the
  CPU tests run it.
- `auto`: the fastest of those that serve the mask kind on this platform (cudnn on GPU, splash on
  TPU), else `xla`, with one logged line saying why.

Neither kernel drops attention probabilities (JAX's private cuDNN dropout takes a fixed seed, so
it would drop the same entries every step): a run asking for `cudnn`/`splash` with attention
dropout is refused with the fix (attention dropout 0, MosaicBERT's recipe, or `xla`), and `auto`
keeps `xla` for it. The fused kernels treat the keys' padding as right-aligned (real keys first),
as every batch this codebase builds is; outputs at padded query positions are unspecified (no
loss reads them) and differ between backends.
"""

from __future__ import annotations

import functools
from typing import Callable, Literal

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertology.errors import UserError

Array = jax.Array

BACKENDS = ("xla", "cudnn", "splash", "auto")
_SPLASH_BLOCK = 128  # splash's block sizes are multiples of 128 (TPU lanes); lengths are padded to them


@flax.struct.dataclass
class FusedMask:
    """A mask in the fused kernels' vocabulary: segment ids (a query sees the keys of its own
    segment; 0 marks a padding key), a causal square and a sliding window. `kind` names the mask
    for messages ("padding", "packed", "causal", "packed causal sliding window", ...); kinds with
    no segment form ("prefix", "per-row kinds", "explicit", "cached decoding") have `query` None.
    """

    kind: str = flax.struct.field(pytree_node=False)
    query: Array | None = None  # [batch, queries] int
    key: Array | None = None  # [batch, keys] int, 0: padding
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    window: int | None = flax.struct.field(pytree_node=False, default=None)  # keys per side (`Mask.window`)

    @property
    def packed(self) -> bool:
        return self.kind.startswith("packed")


GENERAL = FusedMask(kind="general")  # a mask given only as a boolean array (a family's own attention)


def choose(requested: str, *, platform: str, dtype: str, head_dim: int, mask: FusedMask | None, bias: bool,
           dropout: bool) -> tuple[str, str]:
    """(backend, why not the fused one) for one attention: the whole dispatch rule.

    `requested` is `model.attention_backend`; `platform` jax's ("cpu", "gpu", "tpu"); `mask` None
    asks about the run as a whole (its config: any mask a kernel takes). An explicit
    `cudnn`/`splash` that cannot serve raises `UserError` naming the fix; `auto` falls back to
    `xla` with the reason ("" when nothing fell back)."""
    if requested not in BACKENDS:
        raise UserError(f"model.attention_backend={requested!r} is unknown; use one of {BACKENDS}")
    if requested == "xla":
        return "xla", ""
    backend = requested if requested != "auto" else {"gpu": "cudnn", "tpu": "splash"}.get(platform)
    if backend is None:
        return "xla", f"no fused attention kernel on {platform}"
    why = _cannot(backend, platform=platform, dtype=dtype, head_dim=head_dim, mask=mask, bias=bias,
                  dropout=dropout, strict=requested == "auto")
    if not why:
        return backend, ""
    if requested == "auto":
        return "xla", f"{backend} {why}"
    raise UserError(f"model.attention_backend={requested!r} {why}; use model.attention_backend='auto' (falls back to "
                    "'xla') or 'xla'" + (", or set model.attention_dropout_rate=0 (MosaicBERT's recipe)" if dropout else ""))


def _cannot(backend: str, *, platform: str, dtype: str, head_dim: int, mask: FusedMask | None, bias: bool,
            dropout: bool, strict: bool) -> str:
    """Why `backend` cannot serve this attention ("" if it can). `strict` (auto): also where it
    could but would not be faster (cuDNN with a mask it reads as a bias, or a learned bias)."""
    if dropout:
        return "cannot drop attention probabilities (model.attention_dropout_rate > 0 while training)"
    if backend == "cudnn":
        if platform != "gpu":
            return f"needs an NVIDIA GPU (this process runs on {platform})"
        if dtype not in ("bfloat16", "float16"):
            return f"runs bfloat16 or float16 only (model.dtype={dtype!r}; set model.dtype='bfloat16')"
        if head_dim % 8 or head_dim > 256:
            return f"needs a head width that is a multiple of 8 and at most 256 (it is {head_dim})"
        if strict and mask is not None and (mask.query is None or (mask.window is not None and not mask.causal)):
            return f"takes the {mask.kind} mask only as a dense bias, no faster than xla"
        if strict and bias:
            return "would need the gradient of a learned score bias, which cuDNN supports only partly"
        return ""
    if platform == "gpu":
        return "is the Pallas TPU kernel; on an NVIDIA GPU use 'cudnn'"
    if mask is not None and mask.query is None:
        return f"has no form for the {mask.kind} mask (its masks are segment ids and a causal square)"
    if bias:
        return "takes no additive score bias (T5's buckets, Transformer-XL's and XLNet's position terms)"
    return ""


def causal_blocks(length: int) -> int:
    """How many query blocks a causal square of `length` runs in (see `attend`): the most of
    8, 4, 2 that divide it into blocks of at least 128 queries (smaller blocks cost more in
    per-op overhead than the skipped scores save), else 1."""
    return next((b for b in (8, 4, 2) if length % b == 0 and length // b >= 128), 1)


def scores(q: Array, k: Array, bias: Array | None = None, scale: float | None = None) -> Array:
    """The pre-softmax scores [batch, heads, queries, keys] in float32, before any mask: what
    the explicit path normalises and what attention distillation (TinyBERT) compares.

    `scale` None divides q·k by sqrt(head width) in the compute dtype (the core's long-standing
    arithmetic, kept so that sown scores and training runs do not move); otherwise multiplies."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    if scale is None:
        s = s / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    elif scale != 1.0:
        s = s * jnp.asarray(scale, q.dtype)
    return s.astype(jnp.float32) + (0.0 if bias is None else bias.astype(jnp.float32))


def probabilities(s: Array, allowed: Array | None = None, is_causal: bool = False) -> Array:
    """The softmax of scores `s` [batch, heads, queries, keys] over the allowed keys (`allowed`,
    `is_causal` as `attend` takes them); a masked key's probability is exactly 0."""
    visible = jnp.ones((1, 1, 1, s.shape[-1]), bool) if allowed is None else allowed
    if is_causal:
        visible = visible & (jnp.arange(s.shape[-2])[:, None] >= jnp.arange(s.shape[-1])[None, :])
    return jax.nn.softmax(jnp.where(visible, s, jnp.finfo(jnp.float32).min), axis=-1)


def sow(module: nn.Module, q: Array, k: Array, allowed: Array | None, is_causal: bool, bias: Array | None = None,
        scale: float | None = None, probs: bool = True) -> None:
    """What an attention layer sows when its `intermediates` collection is mutable (never computed
    otherwise): `scores` (the pre-softmax scores, float32, unmasked), which attention distillation
    compares (TinyBERT, MobileBERT), and `probs` (their softmax over the allowed keys, the
    attention maps `bertology.analyze attention` reads). `probs=False`: the layer's softmax is not
    over these scores (BigBird's block-sparse pattern), so it has no maps to give."""
    if module.is_mutable_collection("intermediates"):
        s = scores(q, k, bias, scale)
        module.sow("intermediates", "scores", s)
        if probs:
            module.sow("intermediates", "probs", probabilities(s, allowed, is_causal))


def attend(q: Array, k: Array, v: Array, *, allowed: Array | None = None, is_causal: bool = False,
           bias: Array | None = None, scale: float | None = None,
           dropout: Callable[[Array], Array] | None = None, backend: str = "xla",
           fused: FusedMask = GENERAL) -> Array:
    """softmax(scale · q·k + bias, over the allowed keys) · v, in [batch, length, heads, head_dim].

    - `allowed`: boolean, broadcastable to [batch, heads, queries, keys]; `is_causal` further
      restricts query i to keys 0..i (a plain causal square, left to the kernel so it can skip
      blocks without a materialised mask);
    - `bias`: the family's additive score terms (see the module docstring), pre-scaled;
    - `scale`: None for 1/sqrt(head width), else the factor (1.0: T5's unscaled q·k);
    - `dropout`: applied to the float32 probabilities (cast inside it if the draw should see the
      compute dtype); None means no dropout;
    - `backend`: `model.attention_backend` (see the module docstring); `fused` the same mask in
      the fused kernels' vocabulary (`Mask.fused`), GENERAL where there is only `allowed`.

    On xla, a query with no allowed key gets the mean of all values (a uniform softmax); under a
    sliding window (run by `banded`), the mean of its block's values.
    """
    chosen, why = choose(backend, platform=jax.default_backend(), dtype=str(jnp.dtype(q.dtype)), head_dim=q.shape[-1],
                         mask=fused, bias=bias is not None, dropout=dropout is not None)
    if chosen == "cudnn":
        chosen, why = _probe_cudnn(backend, _signature(q, k, v, allowed, is_causal, bias, scale, fused))
    if why:
        _log_once(f"attention: {why}; running xla")
    if chosen == "cudnn":
        return _cudnn(q, k, v, allowed, is_causal, bias, scale, fused)
    if chosen == "splash":
        return _splash(q, k, v, scale, fused)
    if (fused.window is not None and fused.query is not None and fused.key is not None and bias is None
            and q.shape[1] == k.shape[1]):
        return banded(q, k, v, window=fused.window, query_segments=fused.query, key_segments=fused.key,
                      causal=fused.causal, scale=scale, dropout=dropout)
    if dropout is None:
        return jax.nn.dot_product_attention(q, k, v, bias=None if bias is None else bias.astype(q.dtype),
                                            mask=allowed, is_causal=is_causal, scale=scale)
    return _explicit(q, k, v, allowed, is_causal, bias, scale, dropout)


@functools.cache
def _log_once(line: str) -> None:
    """One line per distinct fallback (every layer traces the same attention)."""
    if jax.process_index() == 0:
        print(line, flush=True)


def _cudnn(q: Array, k: Array, v: Array, allowed: Array | None, is_causal: bool, bias: Array | None,
           scale: float | None, fused: FusedMask, implementation: Literal["xla", "cudnn"] = "cudnn") -> Array:
    """cuDNN flash attention: key lengths and `is_causal` for the kinds that have them, else the
    boolean mask at full [batch, 1, queries, keys] (cuDNN's bias must span both lengths).

    An odd number of queries is padded by one: cuDNN 9.19 refused 81, 21 and 615 queries ("Unsupported
    sequence length") and took 154 and 2,458 on an H200 (docs/accelerators.md, run 7), and the
    last layer's gathered MLM rows (predictions + [CLS]) are often odd. The padded query sees
    what the last one sees and its output is dropped, so nothing else changes; causal attention
    (a square: as many queries as keys) is left as it is. (`implementation`: "xla" runs the
    same path on any platform, for the tests.)"""
    lengths, mask, window = None, None, None
    if fused.key is not None and not fused.packed and (fused.window is None or fused.causal):
        lengths = jnp.sum(fused.key > 0, axis=-1, dtype=jnp.int32)
        is_causal = fused.causal
        window = None if fused.window is None else (fused.window, 0)  # cuDNN's windows look back only
    elif allowed is not None:
        mask = jnp.broadcast_to(allowed, (q.shape[0], 1, q.shape[1], k.shape[1]))
    queries = q.shape[1]
    if queries % 2 and not is_causal:
        rows = lambda x, mode="constant": jnp.pad(x, [(0, int(a == 2)) for a in range(x.ndim)], mode=mode)  # noqa: E731
        q = jnp.pad(q, ((0, 0), (0, 1), (0, 0), (0, 0)))
        mask = None if mask is None else rows(mask, "edge")
        bias = bias if bias is None or bias.shape[2] == 1 else rows(bias)
    out = jax.nn.dot_product_attention(q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
                                       is_causal=is_causal, scale=scale, key_value_seq_lengths=lengths,
                                       local_window_size=window, implementation=implementation)
    return out[:, :queries]


def _signature(q: Array, k: Array, v: Array, allowed: Array | None, is_causal: bool, bias: Array | None,
               scale: float | None, fused: FusedMask) -> tuple:
    """What `_probe_cudnn` compiles: the shapes and dtypes of one attention call, hashable."""
    spec = lambda x: None if x is None else jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    return (spec(q), spec(k), spec(v), spec(allowed), is_causal, spec(bias), scale, fused.kind, fused.causal,
            fused.window, spec(fused.query), spec(fused.key))


@functools.cache
def _probe_cudnn(requested: str, signature: tuple) -> tuple[str, str]:
    """Compile the cuDNN attention of this signature, forward and backward, before the run does:
    unsupported combinations fail at compile time ("No valid engine configs"), not at trace time,
    so without the probe they would fail inside the first step's compile with a long trace.
    (backend, why): `auto` falls back to xla; an explicit `cudnn` stops with the error's first line."""
    q, k, v, allowed, is_causal, bias, scale, kind, causal, window, query, key = signature
    has = lambda x: x is not None  # noqa: E731

    def loss(q, k, v, allowed, bias, query, key):
        fused = FusedMask(kind=kind, query=query, key=key, causal=causal, window=window)
        out = _cudnn(q, k, v, allowed, is_causal, bias, scale, fused)
        return jnp.sum(out.astype(jnp.float32))

    args = [x if has(x) else None for x in (q, k, v, allowed, bias, query, key)]
    try:
        jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    except Exception as e:  # noqa: BLE001 - any compile failure means: this kernel cannot run it
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if requested == "auto":
            return "xla", f"cudnn failed to compile this attention ({first})"
        raise UserError(f"model.attention_backend='cudnn' cannot compile this attention ({first}); use "
                        "model.attention_backend='auto' (falls back to 'xla') or 'xla'") from None
    return "cudnn", ""


def _splash(q: Array, k: Array, v: Array, scale: float | None, fused: FusedMask) -> Array:
    """The Pallas splash kernel, per example (it takes [heads, length, head_dim]), on lengths
    padded to its block multiple: padded keys get a segment no query has, padded queries one no
    key has (their outputs are sliced away)."""
    assert fused.query is not None and fused.key is not None, "choose() sends splash segment masks only"
    batch, qlen, heads, width = q.shape
    klen = k.shape[1]
    qpad, kpad = -qlen % _SPLASH_BLOCK, -klen % _SPLASH_BLOCK
    q = q * jnp.asarray(width ** -0.5 if scale is None else scale, q.dtype)
    q_seg = jnp.pad(fused.query.astype(jnp.int32), ((0, 0), (0, qpad)), constant_values=-1)
    k_seg = jnp.pad(fused.key.astype(jnp.int32), ((0, 0), (0, kpad)), constant_values=-2)
    heads_first = lambda x, pad: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)  # noqa: E731
    kernel = _splash_kernel(heads, qlen + qpad, klen + kpad, fused.causal, fused.window, jax.default_backend() != "tpu")
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds
    out = jax.vmap(lambda q, k, v, qs, ks: kernel(q, k, v, segment_ids=SegmentIds(q=qs, kv=ks)))(
        heads_first(q, qpad), heads_first(k, kpad), heads_first(v, kpad), q_seg, k_seg)
    return out.transpose(0, 2, 1, 3)[:, :qlen].astype(v.dtype)


@functools.cache
def _splash_kernel(heads: int, qlen: int, klen: int, causal: bool, window: int | None, interpret: bool) -> Callable:
    """One splash kernel per shape and mask (building one processes the mask's blocks in numpy).
    Blocks: the largest of 512, 256, 128 that divides both lengths (bigger blocks keep the TPU's
    matrix unit busier; at these lengths every one fits in its memory)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    block = next(b for b in (512, 256, 128) if qlen % b == 0 and klen % b == 0)
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    shape = (qlen, klen)
    one: sa.Mask
    if window is not None:  # its blocks outside the band are skipped, not computed and masked
        one = sa.LocalMask(shape, window_size=(window, 0 if causal else window), offset=0)
    else:
        one = sa.CausalMask(shape) if causal else sa.FullMask(shape)
    mask = sa.MultiHeadMask([one] * heads)
    with jax.ensure_compile_time_eval():  # its mask tables are constants, not values of the trace that asks first
        return sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret)


def _explicit(q: Array, k: Array, v: Array, allowed: Array | None, is_causal: bool, bias: Array | None,
              scale: float | None, dropout: Callable[[Array], Array]) -> Array:
    """Softmax attention with dropout on the probabilities, written out.

    A causal square runs in blocks of queries (`causal_blocks`), block i against the keys up to
    its own last query only: the later keys are masked for all its queries, so their scores,
    softmax, dropout draws and products with the values are skipped (at 8 blocks, 7/16 of the
    square). Every row is what the full square gives it: a masked key's probability is exactly 0.
    """
    length = q.shape[1]
    blocks = causal_blocks(length) if is_causal and length == k.shape[1] else 1
    size = length // blocks
    if allowed is None:
        allowed = jnp.ones((1, 1, 1, k.shape[1]), bool)
    ctx = []
    for i in range(blocks):
        lo, hi = i * size, (i + 1) * size
        end = hi if is_causal else k.shape[1]
        visible = allowed[:, :, lo:hi, :end] if allowed.shape[2] > 1 else allowed[..., :end]
        if is_causal:
            visible = visible & (jnp.arange(lo, hi)[:, None] >= jnp.arange(end)[None, :])
        block_bias = None if bias is None else (bias[:, :, lo:hi, :end] if bias.shape[2] > 1 else bias[..., :end])
        s = scores(q[:, lo:hi], k[:, :end], block_bias, scale)
        probs = dropout(probabilities(s, visible))
        ctx.append(jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v[:, :end]))
    return ctx[0] if blocks == 1 else jnp.concatenate(ctx, axis=1)


def banded(q: Array, k: Array, v: Array, *, window: int, query_segments: Array, key_segments: Array,
           causal: bool = False, scale: float | None = None, dropout: Callable[[Array], Array] | None = None,
           extra: tuple[Array, Array, Array] | None = None) -> Array:
    """Sliding-window attention in O(length · window), equal to the masked square.

    Query i sees key j when |i - j| <= `window` (and j <= i when `causal`), their segments match
    (`query_segments` [batch, L], `key_segments` [batch, L] with 0 for padding, `FusedMask`'s ids).
    The queries are cut into blocks of c = window positions and block n attends to key blocks
    n-1, n, n+1 only (3c keys, which hold its whole band), the blocked form of Longformer's
    `sliding_chunks` (Beltagy et al. 2020, arXiv 2004.05150, §3; HF `LongformerSelfAttention.
    _sliding_chunks_query_key_matmul`), so scores are [batch, heads, L/c, c, 3c], not [L, L].

    `extra` = (keys [batch, G, heads, d], values, allowed [batch, L, G] bool): G more keys every
    query may see besides its band, in the same softmax (Longformer's global tokens, attended by
    every token); a key must not be in both (the caller leaves it out of the band's segments).
    A query that sees no key gets the mean of its block's values (the square gives all values'):
    only padded queries do, whose outputs no loss reads."""
    batch, length, heads, width = q.shape
    c = max(min(window, length), 1)
    blocks = -(-length // c)
    pad = blocks * c - length
    # keys padded by one block in front and up to a whole number of blocks plus one behind
    k_seg = jnp.pad(key_segments.astype(jnp.int32), ((0, 0), (c, pad + c)))
    q_seg = jnp.pad(query_segments.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)

    def neighbours(x: Array) -> Array:  # [batch, blocks + 2, c, ...] -> [batch, blocks, 3c, ...]
        return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)

    def key_blocks(x: Array) -> Array:
        x = jnp.pad(x, ((0, 0), (c, pad + c), (0, 0), (0, 0)))
        return neighbours(x.reshape(batch, blocks + 2, c, heads, width))

    kb, vb = key_blocks(k), key_blocks(v)
    qb = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(batch, blocks, c, heads, width)
    s = jnp.einsum("bnqhd,bnkhd->bhnqk", qb, kb)
    s = s / jnp.sqrt(width).astype(q.dtype) if scale is None else s * jnp.asarray(scale, q.dtype)
    q_pos = jnp.arange(blocks * c).reshape(blocks, c)
    k_pos = neighbours(jnp.arange(-c, (blocks + 1) * c).reshape(1, blocks + 2, c))[0]  # [blocks, 3c]
    offset = q_pos[:, :, None] - k_pos[:, None, :]
    near = (jnp.abs(offset) <= window) & ((offset >= 0) if causal else True)
    same = q_seg.reshape(batch, blocks, c)[..., None] == neighbours(k_seg.reshape(batch, blocks + 2, c))[:, :, None]
    ok = near[None] & same & (neighbours(k_seg.reshape(batch, blocks + 2, c)) != 0)[:, :, None]  # [b, n, c, 3c]
    lowest = jnp.finfo(jnp.float32).min
    s = jnp.where(ok[:, None], s.astype(jnp.float32), lowest)
    if extra is not None:
        gk, gv, g_ok = extra
        gs = jnp.einsum("bnqhd,bghd->bhnqg", qb, gk)
        gs = gs / jnp.sqrt(width).astype(q.dtype) if scale is None else gs * jnp.asarray(scale, q.dtype)
        g_ok = jnp.pad(g_ok, ((0, 0), (0, pad), (0, 0))).reshape(batch, blocks, c, -1)
        s = jnp.concatenate([s, jnp.where(g_ok[:, None], gs.astype(jnp.float32), lowest)], axis=-1)
    p = jax.nn.softmax(s, axis=-1)
    if dropout is not None:
        p = dropout(p)
    p = p.astype(v.dtype)
    out = jnp.einsum("bhnqk,bnkhd->bnqhd", p[..., :3 * c], vb)
    if extra is not None:
        out = out + jnp.einsum("bhnqg,bghd->bnqhd", p[..., 3 * c:], extra[1])
    return out.reshape(batch, blocks * c, heads, width)[:, :length]
