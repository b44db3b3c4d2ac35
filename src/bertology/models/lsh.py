"""The Reformer's two chunked self-attentions (Kitaev, Kaiser & Levskaya 2020, "Reformer: The
Efficient Transformer", arXiv 2001.04451, section 2), computed as Hugging Face's
`LSHSelfAttention` and `LocalSelfAttention` do (transformers 4.57.6,
`models/reformer/modeling_reformer.py`; line numbers below are that file's).

**LSH attention** (`lsh_attend`) shares one projection between queries and keys (section 2,
"Shared-QK Transformer"): the keys are the queries normalised to unit length (`_len_and_dim_norm`,
1076-1090: x · rsqrt(mean(x²) + 1e-6), then / sqrt(head width)), the queries are left as they
are. Each of `num_hashes` rounds hashes every vector with a random rotation R ([head_dim, b/2]
per head and round; angular LSH, Andoni et al. 2015): the bucket is argmax([xR; -xR]) (717-789),
or, with the buckets factorised into (b1, b2, ...), one such argmax per factor over its own
columns of R, combined as b1-index + b1 · b2-index + ... . Tokens are then sorted by (round,
bucket, position) (`_stable_argsort`, 176-182), the sorted sequence of all rounds is cut into
chunks of `chunk` tokens, and each chunk attends to itself and to `before` chunks before and
`after` chunks after it, circularly over the whole sorted sequence (`_look_adjacent`, 378-399: so
a round's first chunk sees the previous round's last chunk, and round 0's first chunk the last
round's last one). Masks: padding keys and (decoder) keys after the query get -1e9, then the
query's own position gets -1e5 (section 2: a token attends to itself only when nothing else is
allowed; 880-913, applied in that order, so a padded query falls back on itself too). Each round
gives an output and the log-sum-exp of its scores per token; the rounds are combined weighted by
the softmax of those log-sum-exps over rounds (657-674), which is one softmax over every round's
keys together, a key that several rounds (or neighbouring chunks) see counted that many times
(HF, like the code it ports, does not apply the paper's correction for duplicates). Padding
tokens get a bucket of their own, after the real ones (769-776). Rows no longer than one chunk
attend fully, with the same masks and no hashing (565-567, 616-623). The random rotations are an
input: HF draws them from torch's RNG (`torch.randn((heads, head_dim, num_hashes,
rotation_size // 2))`, after `torch.manual_seed(hash_seed)` when the config sets one), so parity
passes HF's draw in.

**Local attention** (`local_attend`) has its own query, key and value projections; keys are
divided by sqrt(head width) (1223); the row is cut into chunks of `chunk` positions, each
attending to itself and `before`/`after` neighbouring chunks, also circularly (so without a
causal mask the first chunk sees the last one, as HF computes it); padding and (decoder) later
keys get -1e9; no self mask (1160-1353).

Both take and return [batch, length, heads, head_dim] and never form a [length, length] array
once the row is longer than a chunk: the scores are [chunks, chunk, chunk · (1 + before +
after)] per head (and round). `length` must be a multiple of `chunk` then (the Reformer pads its
rows to one, as HF's `ReformerModel.forward` does, 2091-2121). Scores are float32 whatever the
compute dtype.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bertology.models.transformer import hash32

Array = jax.Array
Buckets = int | tuple[int, ...]

MASKED = -1e9  # HF's mask_value_float32 (460, 1158)
SELF = -1e5  # HF's self_mask_value_float32 (459)


def rotation_size(num_buckets: Buckets) -> int:
    """Columns of one round's random rotation: b for b buckets, b1 + b2 + ... for factorised ones
    (each factor's argmax reads b_k / 2 columns and their negations)."""
    return num_buckets if isinstance(num_buckets, int) else sum(num_buckets)


def total_buckets(num_buckets: Buckets) -> int:
    """How many buckets a round has: b, or b1 · b2 · ... when factorised."""
    if isinstance(num_buckets, int):
        return num_buckets
    total = 1
    for factor in num_buckets:
        total *= factor
    return total


def default_buckets(length: int, chunk: int, max_positions: int) -> Buckets:
    """HF's `_set_num_buckets` (810-828), for a config that leaves `num_buckets` unset: the largest
    power of two at most 2 · (length // chunk), factorised into two when it exceeds
    2 · max(sqrt(max_positions / chunk), chunk). (HF fixes it at the first long row it sees; here
    each length gets its own.)"""
    power = (2 * (length // chunk)).bit_length() - 1
    limit = 2 * max(int((max_positions // chunk) ** 0.5), chunk)
    if 2 ** power > limit:
        return (2 ** (power // 2), 2 ** (power - power // 2))
    return 2 ** power


def random_rotations(key: Array, shape: tuple[int, ...]) -> Array:
    """N(0, 1) rotations of `shape` drawn from `key` (training draws each layer's afresh every
    step): Box-Muller over two 24-bit uniforms per entry, each from the core `Dropout`'s keyed
    integer hash of the entry's index (`transformer.hash32`, keyed by two threefry words). XLA:CPU
    took ~1 s to compile `jax.random.normal` for one layer's few hundred draws, the hash a few
    milliseconds."""
    k0, k1 = jax.random.bits(key, (2,), jnp.uint32)
    words = hash32(hash32(jnp.arange(2 * math.prod(shape), dtype=jnp.uint32) ^ k0) + k1)
    uniform = (words >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)  # [0, 1)
    u1, u2 = 1.0 - uniform[0::2], uniform[1::2]  # u1 in (0, 1]
    return (jnp.sqrt(-2.0 * jnp.log(u1)) * jnp.cos(jnp.float32(2 * math.pi) * u2)).reshape(shape)


def fixed_rotations(seed: int, layer: int, shape: tuple[int, ...]) -> np.ndarray:
    """Evaluation's rotations: N(0, 1) from numpy's generator seeded with (seed, layer), a
    constant of the program (deterministic evaluation, nothing to compile)."""
    return np.random.default_rng((seed, layer)).standard_normal(shape).astype(np.float32)


def look_adjacent(x: Array, before: int, after: int, axis: int = 2) -> Array:
    """Chunks [..., n, c, ...] (chunk index on `axis`, positions on `axis` + 1) -> [..., n,
    c · (1 + before + after), ...]: each chunk preceded by its `before` previous chunks and
    followed by its `after` next ones, circularly (HF's `_look_adjacent`)."""
    if before == 0 and after == 0:
        return x
    return jnp.concatenate([jnp.roll(x, -i, axis=axis) for i in range(-before, after + 1)], axis=axis + 1)


def hash_buckets(vectors: Array, rotations: Array, num_buckets: Buckets) -> Array:
    """[batch, heads, rounds, length] bucket of each vector ([batch, heads, length, head_dim]) in
    each round: argmax over [xR; -xR] (HF's `_hash_vectors`), factor by factor when the buckets
    are factorised. `rotations`: [heads, head_dim, rounds, rotation_size // 2]. One bucket (a
    factor of 1, no columns: everything in bucket 0) is allowed here, for tests; HF takes even
    numbers only."""
    rotated = jnp.einsum("bhld,hdnr->bhnlr", jax.lax.stop_gradient(vectors).astype(jnp.float32),
                         rotations.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    factors = (num_buckets,) if isinstance(num_buckets, int) else tuple(num_buckets)
    buckets, start, product = None, 0, 1
    for factor in factors:
        part = rotated[..., start:start + factor // 2]
        index = (jnp.zeros(part.shape[:-1], jnp.int32) if factor == 1  # one bucket: nothing to choose
                 else jnp.argmax(jnp.concatenate([part, -part], axis=-1), axis=-1))
        buckets = index if buckets is None else buckets + product * index
        start += factor // 2
        product *= factor
    assert buckets is not None
    return buckets.astype(jnp.int32)


def _unit_keys(x: Array) -> Array:
    """Shared-QK keys: `x` normalised to unit root-mean-square, then / sqrt(head width) (HF's
    `_len_and_dim_norm`, eps 1e-6)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) / jnp.sqrt(jnp.float32(x.shape[-1]))


def _allowed(q_pos: Array, k_pos: Array, k_real: Array, q_doc: Array | None, k_doc: Array | None,
             causal: bool) -> Array:
    """Which (query, key) pairs may attend: a real key (`k_real`, [..., keys] bool), (causal) not
    after the query, (packed) of the query's own document. Positions and documents are [..., q]
    and [..., k] over the same leading axes; the result is [..., q, k]."""
    ok = k_real[..., None, :]
    if causal:
        ok = ok & (q_pos[..., :, None] >= k_pos[..., None, :])
    if q_doc is not None and k_doc is not None:
        ok = ok & (q_doc[..., :, None] == k_doc[..., None, :])
    return ok


def _batched(spec: str, a: Array, b: Array) -> Array:
    """`einsum(spec)` over a's and b's shared leading axes, run as one 3-D batched matrix product
    (the leading axes merged): XLA:CPU compiled a chunked score-softmax-context product's gradient
    in 0.25 s so, 0.53 s as 5-D dot_generals. `spec`: "qd,kd->qk" or
    "qk,kd->qd" on the last two axes."""
    lead = a.shape[:-2]
    a3 = a.reshape(-1, *a.shape[-2:])
    b3 = jnp.broadcast_to(b, (*lead, *b.shape[-2:])).reshape(-1, *b.shape[-2:])
    out = jnp.einsum("n" + spec.replace(",", ",n").replace("->", "->n"), a3, b3, preferred_element_type=jnp.float32)
    return out.reshape(*lead, *out.shape[-2:])


def _logsumexp(s: Array, axis: int) -> tuple[Array, Array]:
    """(exp(s - max), max + log(sum(exp(s - max)))) along `axis` (kept): the log-sum-exp without
    `jax.nn.logsumexp`'s handling of infinite inputs, which the scores never hold (masked ones are
    -1e9) and which tripled XLA:CPU's compile time of the softmax's gradient (0.73 s against
    0.24 s for one chunked attention)."""
    top = jax.lax.stop_gradient(jnp.max(s, axis=axis, keepdims=True))
    e = jnp.exp(s - top)
    return e, top + jnp.log(jnp.sum(e, axis=axis, keepdims=True))


def _softmax_values(s: Array, v: Array, dropout: Callable[[Array], Array] | None) -> tuple[Array, Array]:
    """(softmax(s) · v, logsumexp(s)) over the last axis of the float32 scores `s` (HF: `logits =
    logsumexp(dots)`, `probs = exp(dots - logits)`, then dropout on the probabilities)."""
    e, lse = _logsumexp(s, -1)
    probs = e / jnp.sum(e, axis=-1, keepdims=True)
    if dropout is not None:
        probs = dropout(probs)
    return _batched("qk,kd->qd", probs.astype(v.dtype), v), lse[..., 0]


def _heads_first(x: Array) -> Array:
    return jnp.swapaxes(x, 1, 2)


def lsh_attend(qk: Array, v: Array, *, rotations: Array, num_buckets: Buckets, chunk: int, before: int, after: int,
               keys: Array, causal: bool = False, documents: Array | None = None,
               buckets: Array | None = None, dropout: Callable[[Array], Array] | None = None) -> tuple[Array, Array | None]:
    """Shared-QK LSH attention (module docstring): (output [batch, length, heads, head_dim],
    buckets [batch, heads, rounds, length] or None for a row of one chunk).

    `qk`, `v`: [batch, length, heads, head_dim]; `rotations`: [heads, head_dim, rounds,
    rotation_size // 2] (`rotation_size`), whose round count is `num_hashes`; `keys` [batch,
    length] bool: the real tokens; `documents` [batch, length] int: packed documents (a query
    sees its own document's keys only; HF has none); `buckets`: the buckets of an earlier call on
    the same input, reused instead of hashing again (a reversible layer recomputed in the backward
    pass must sort as its forward pass did; HF caches them the same way); `dropout`: applied to
    the probabilities.
    """
    batch, length, heads, width = qk.shape
    qk_h, v_h = _heads_first(qk), _heads_first(v)  # [batch, heads, length, width]
    if length <= chunk:  # one chunk: every key, the same masks, no hashing (HF's standard self-attention)
        pos = jnp.arange(length)
        s = _batched("qd,kd->qk", qk_h.astype(jnp.float32), _unit_keys(qk_h))
        docs = None if documents is None else documents[:, None, :]
        ok = _allowed(pos, pos, keys[:, None, :], docs, docs, causal)
        s = jnp.where(ok, s, MASKED)
        s = jnp.where(pos[:, None] != pos[None, :], s, SELF)
        out, _ = _softmax_values(s, v_h, dropout)
        return _heads_first(out).astype(qk.dtype), None
    if length % chunk:
        raise ValueError(f"LSH attention over {length} tokens needs a multiple of its chunk length {chunk}")
    if rotations.shape[:2] != (heads, width) or rotations.shape[3] != rotation_size(num_buckets) // 2:
        raise ValueError(f"rotations {rotations.shape} for {heads} heads of {width} and {num_buckets} buckets: need "
                         f"[{heads}, {width}, rounds, {rotation_size(num_buckets) // 2}]")
    rounds = rotations.shape[2]
    n = total_buckets(num_buckets)
    if buckets is None:
        buckets = hash_buckets(qk_h, rotations, num_buckets)
        buckets = jnp.where(keys[:, None, None, :], buckets, n)  # padding: a bucket of its own, after the real ones
    buckets = jax.lax.stop_gradient(buckets)
    # sort by (round, bucket, position): a stable sort of bucket + round · (n + 1) over rounds · length
    offsets = (jnp.arange(rounds, dtype=jnp.int32) * (n + 1))[None, None, :, None]
    order = jnp.argsort((buckets + offsets).reshape(batch, heads, rounds * length), axis=-1, stable=True)
    undo = jnp.argsort(order, axis=-1)
    pos = order % length  # [batch, heads, rounds · length]: the token at each sorted slot
    # one gather sorts the shared query-key, the value, the padding mask and the documents
    token = [qk_h.astype(jnp.float32), v_h.astype(jnp.float32),
             jnp.broadcast_to(keys[:, None, :, None], (batch, heads, length, 1)).astype(jnp.float32)]
    if documents is not None:
        token.append(jnp.broadcast_to(documents[:, None, :, None], (batch, heads, length, 1)).astype(jnp.float32))
    packed = jnp.take_along_axis(jnp.concatenate(token, axis=-1), pos[..., None], axis=2)
    chunks = rounds * length // chunk
    packed = packed.reshape(batch, heads, chunks, chunk, -1)
    q, vs = packed[..., :width], packed[..., width:2 * width]
    k = look_adjacent(_unit_keys(q), before, after)
    vs = look_adjacent(vs.astype(v.dtype), before, after)
    q_pos = pos.reshape(batch, heads, chunks, chunk)
    k_pos = look_adjacent(q_pos, before, after)
    k_real = look_adjacent(packed[..., 2 * width] > 0.5, before, after)
    q_doc = k_doc = None
    if documents is not None:
        q_doc = packed[..., 2 * width + 1]
        k_doc = look_adjacent(q_doc, before, after)
    s = _batched("qd,kd->qk", q, k)
    s = jnp.where(_allowed(q_pos, k_pos, k_real, q_doc, k_doc, causal), s, MASKED)
    s = jnp.where(q_pos[..., :, None] != k_pos[..., None, :], s, SELF)
    out, lse = _softmax_values(s, vs, dropout)
    # one gather puts each round's output and log-sum-exp back in token order
    both = jnp.concatenate([out.reshape(batch, heads, rounds * length, width), lse.reshape(batch, heads, -1, 1)], -1)
    both = jnp.take_along_axis(both, undo[..., None], axis=2)
    out, lse = both[..., :width], both[..., width]
    if rounds > 1:  # each round weighted by the softmax over rounds of its log-sum-exp
        out = out.reshape(batch, heads, rounds, length, width)
        lse = lse.reshape(batch, heads, rounds, length, 1)
        out = jnp.sum(out * jnp.exp(lse - _logsumexp(lse, 2)[1]), axis=2)
    return _heads_first(out).astype(qk.dtype), buckets


def local_attend(q: Array, k: Array, v: Array, *, chunk: int, before: int, after: int, keys: Array,
                 causal: bool = False, documents: Array | None = None,
                 dropout: Callable[[Array], Array] | None = None) -> Array:
    """Chunked local attention (module docstring), [batch, length, heads, head_dim] in and out;
    `keys`, `documents` and `dropout` as in `lsh_attend`."""
    batch, length, heads, width = q.shape
    q_h, v_h = _heads_first(q).astype(jnp.float32), _heads_first(v)
    k_h = _heads_first(k).astype(jnp.float32) / jnp.sqrt(jnp.float32(width))
    pos = jnp.arange(length)
    if length <= chunk:
        s = _batched("qd,kd->qk", q_h, k_h)
        docs = None if documents is None else documents[:, None, :]
        ok = _allowed(pos, pos, keys[:, None, :], docs, docs, causal)
        out, _ = _softmax_values(jnp.where(ok, s, MASKED), v_h, dropout)
        return _heads_first(out).astype(q.dtype)
    if length % chunk:
        raise ValueError(f"local attention over {length} tokens needs a multiple of its chunk length {chunk}")
    n = length // chunk
    q_c = q_h.reshape(batch, heads, n, chunk, width)
    k_c = look_adjacent(k_h.reshape(batch, heads, n, chunk, width), before, after)
    v_c = look_adjacent(v_h.reshape(batch, heads, n, chunk, width), before, after)
    q_pos = pos.reshape(n, chunk)
    k_pos = look_adjacent(q_pos, before, after, axis=0)
    k_real = look_adjacent(keys.reshape(batch, 1, n, chunk), before, after)
    q_doc = k_doc = None
    if documents is not None:
        q_doc = documents.reshape(batch, 1, n, chunk)
        k_doc = look_adjacent(q_doc, before, after)
    s = _batched("qd,kd->qk", q_c, k_c)
    ok = _allowed(q_pos, k_pos, k_real, q_doc, k_doc, causal)
    out, _ = _softmax_values(jnp.where(ok, s, MASKED), v_c, dropout)
    return _heads_first(out.reshape(batch, heads, length, width)).astype(q.dtype)
