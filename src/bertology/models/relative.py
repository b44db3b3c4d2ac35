"""Transformer-XL's relative attention (Dai et al. 2019), shared by Transformer-XL and XLNet.

A query at absolute position a scores key j as

    (q + r_w)·k_j  +  (q + r_r)·W_r R[a - j]  [+ (q + r_s)·s[seg_a != seg_j]   (XLNet only)]

scaled by 1/sqrt(head width): a content term, a position term from a sinusoidal encoding R of the
*distance* a - j (never of a or j), and XLNet's relative segment term. Because scores depend only
on distances, the states of the previous segment can be kept as memory (gradient stopped) and
attended to as extra keys before the current ones: the recurrence that gives both models their
long context. Keys are [memory; current] in that order, so a current query i sits at absolute
position mem_len + i.

The position term is computed for every (query, encoding) pair, [q, klen + q] with encodings of
distances klen, klen-1, ..., -q+1 (the reference XLNet's range; Transformer-XL's causal range
klen-1..0 is its sub-range), then `rel_shift` moves each row so column j holds distance a - j:
the reference's pad-and-reshape trick, no gather. `bi_data` rows (XLNet) use negated distances.

Only q·k is attention proper; the rest (r_w·k, the position and segment terms) reaches the shared
softmax attention (`attention.attend`, which every family goes through) as its additive score
term, so the fused kernel and its dropout-free evaluation path serve these models too.

Memory is carried as data (`batch["carry"]`): per layer the states the layer read last segment,
right-aligned in `mem_len` slots, and a [batch, mem_len] validity mask. Zeros (the initial carry,
and what a pass start resets it to) mean "no memory yet": the first segment then sees only
itself, as the reference Transformer-XL's empty memory does. Hugging Face's TransfoXL instead
starts from zero *states* that are visible; a carry of zero states with mask 1 reproduces that.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.models.attention import attend
from bertology.models.transformer import HeadsDense, TransformerConfig, init, layer_norm, sinusoid, sublayer_output

Array = jax.Array
BIASES = ("r_w_bias", "r_r_bias")  # content and position biases; XLNet adds r_s_bias


@dataclasses.dataclass(frozen=True)
class Recurrence:
    """The settings of relative attention and memory beyond `TransformerConfig`.

    - `mem_len`: memory slots per layer (0: none); `reuse_len` (XLNet): only the first reuse_len
      positions of a segment enter the memory (0: all), since the rest are re-read next step;
    - `clamp_len`: distances beyond it use its encoding (-1: no clamp);
    - `same_length`: every query sees the same number of keys (itself and the mem_len - 1 before
      it), as Transformer-XL evaluates; `untie_r`: r_w/r_r(/r_s) per layer instead of shared;
    - `bi_data` (XLNet): the second half of the batch holds reversed sequences, whose distances
      are negated.
    """

    mem_len: int = 0
    reuse_len: int = 0
    clamp_len: int = -1
    same_length: bool = False
    untie_r: bool = True
    bi_data: bool = False

    def __post_init__(self):
        if self.mem_len < 0 or self.reuse_len < 0:
            raise UserError(f"model.mem_len={self.mem_len} / model.reuse_len={self.reuse_len} must be >= 0")
        if self.same_length and self.mem_len == 0:
            raise UserError("model.same_length needs memory (each query sees mem_len keys); set model.mem_len > 0")


def recurrence(model_config: Any, keys: tuple[str, ...]) -> Recurrence:
    """The `Recurrence` of a `model` block (its `keys`, absent ones at their defaults)."""
    block = dict(model_config)
    return Recurrence(**{k: block[k] for k in keys if k in block})


def distances(qlen: int, klen: int, clamp_len: int) -> Array:
    """The distances the encodings cover, klen, klen-1, ..., -qlen+1, clamped to ±clamp_len."""
    d = jnp.arange(klen, -qlen, -1.0)
    return jnp.clip(d, -clamp_len, clamp_len) if clamp_len > 0 else d


def encodings(qlen: int, klen: int, dim: int, clamp_len: int, bi_data: bool = False,
              batch: int = 1) -> Array:
    """R: [1, klen + qlen, dim], or with `bi_data` [batch, ...] whose second half (the reversed
    copies; the data makes the batch even) encodes the negated distances. A single row (one
    example scored alone) is a forward one."""
    d = distances(qlen, klen, clamp_len)
    if not bi_data:
        return sinusoid(d, dim)[None]
    halves = jnp.stack([sinusoid(d, dim), sinusoid(-d, dim)])
    return halves[(jnp.arange(batch) >= (batch + 1) // 2).astype(jnp.int32)]


def rel_shift(x: Array, klen: int) -> Array:
    """[..., q, klen + q] scores against distances klen..-q+1 -> [..., q, klen] where column j of
    row i holds the score at distance (klen - q + i) - j, query i's absolute position minus j.

    Row i's distance d sits at column klen - d, so it must move left by q - i: reshaping the
    [q, klen + q] block as [klen + q, q], dropping the first row and reshaping back does exactly
    that shift per row (Dai et al.'s trick); the first klen columns are the keys."""
    *lead, q, p = x.shape
    x = x.reshape(*lead, p, q)[..., 1:, :].reshape(*lead, q, p - 1)
    return x[..., :klen]


def visible_keys(memory_mask: Array, input_mask: Array) -> Array:
    """[batch, mem_len + length] bool: the valid memory slots, then the real current tokens."""
    return jnp.concatenate([memory_mask > 0, input_mask > 0], axis=1)


def causal_mask(keys: Array, qlen: int, mem_len: int, same_length: bool) -> Array:
    """[batch, qlen, mem_len + qlen] bool: key j visible to query i (absolute a = mem_len + i) iff
    it is valid and j <= a; with `same_length` also j > a - mem_len (the reference's eval mask)."""
    a = mem_len + jnp.arange(qlen)[:, None]
    j = jnp.arange(keys.shape[1])[None, :]
    allowed = j <= a
    if same_length:
        allowed = allowed & (j > a - mem_len)
    return keys[:, None, :] & allowed[None]


def extend_memory(memory: Array, memory_mask: Array, states: Array) -> tuple[Array, Array]:
    """The last mem_len of [memory; states] along the slot axis (memory [batch, layers, mem, d],
    states [batch, layers, n, d]), gradient stopped, and the mask with the n new slots valid.
    Every cached state is visible, padding included, as in both references (their memory masks
    are zeros)."""
    n = states.shape[2]
    memory = jnp.concatenate([memory, states.astype(memory.dtype)], axis=2)[:, :, n:]
    new = jnp.ones((memory_mask.shape[0], n), memory_mask.dtype)
    memory_mask = jnp.concatenate([memory_mask, new], axis=1)[:, n:]
    return jax.lax.stop_gradient(memory), memory_mask


def initial_carry(cfg: TransformerConfig, xl: Recurrence, batch_size: int) -> dict[str, Array]:
    """No memory yet: zero states [batch, layers, mem_len, hidden] and an all-invalid mask."""
    return {"memory": jnp.zeros((batch_size, cfg.num_layers, xl.mem_len, cfg.hidden_size), jnp.float32),
            "memory_mask": jnp.zeros((batch_size, xl.mem_len), jnp.int32)}


def run_carry(cfg: TransformerConfig, xl: Recurrence, batch_size: int) -> dict[str, Array] | None:
    """A run's first carry (the families' `initial_carry`): no memory yet, or None with mem_len 0:
    nothing crosses batches, so the run keeps no carry (and checkpoints no empty arrays)."""
    return initial_carry(cfg, xl, batch_size) if xl.mem_len else None


def carry_of(batch: dict[str, Array], cfg: TransformerConfig, xl: Recurrence) -> dict[str, Array]:
    """The batch's carry, or no memory when it has none (one segment, a fresh evaluation)."""
    carry = batch.get("carry")
    return initial_carry(cfg, xl, batch["input_ids"].shape[0]) if carry is None else carry


def no_bias(cfg: TransformerConfig) -> TransformerConfig:
    """The projections of relative attention have no biases (both references)."""
    return dataclasses.replace(cfg, use_bias=False)


class Biases(nn.Module):
    """r_w, r_r (and for XLNet r_s) [heads, kv]: one set per layer, or one shared (`untie_r=False`)."""

    cfg: TransformerConfig
    segments: bool = False

    @nn.compact
    def __call__(self) -> dict[str, Array]:
        names = BIASES + (("r_s_bias",) if self.segments else ())
        shape = (self.cfg.num_heads, self.cfg.head_dim)
        return {n: self.param(n, init(self.cfg, ("heads", "kv")), shape) for n in names}


class RelativeAttention(nn.Module):
    """Relative multi-head attention over [memory; current] with residual and post-LN, for a
    content stream `h` and optionally XLNet's query stream `g` (same weights; keys and values
    come from the content stream and memory only).

    `allowed` [batch, q, klen] is the content stream's mask, `allowed_g` the query stream's;
    `g` [batch, P, d] holds one row per prediction, placed at its position by `target_mapping`
    [batch, P, q] (one-hot rows, zero rows for padding). `biases`: the shared set when
    `untie_r=False`, else None and the layer owns its own. `segments` [batch, q, klen] bool:
    XLNet's "different segment" for the relative segment term (None: no term).
    """

    cfg: TransformerConfig
    segment_term: bool = False
    untie_r: bool = True

    def score_terms(self, q: Array, k: Array, r: Array, biases: dict[str, Array], segment: Array | None,
                    segments: Array | None) -> Array:
        """[batch, heads, q, klen] float32: every score term but q·k (the content bias r_w·k, the
        position term shifted under its keys, XLNet's segment term), already divided by sqrt(head
        width) because `attend` adds its bias after scaling q·k: the sum is then the reference's
        ((q + r_w)·k + position [+ segment]) / sqrt(head width)."""
        content = jnp.einsum("nd,bknd->bnk", biases["r_w_bias"], k)[:, :, None, :]
        qr = q + biases["r_r_bias"]
        raw = (jnp.einsum("bqnd,pnd->bnqp", qr, r[0]) if r.shape[0] == 1
               else jnp.einsum("bqnd,bpnd->bnqp", qr, r))
        s = content + rel_shift(raw, k.shape[1])
        if segments is not None:
            ef = jnp.einsum("bqnd,snd->bnqs", q + biases["r_s_bias"], segment)
            s = s + jnp.where(segments[:, None], ef[..., 1:], ef[..., :1])
        return s.astype(jnp.float32) * self.cfg.head_dim ** -0.5

    @nn.compact
    def __call__(self, h: Array, memory: Array, pos: Array, allowed: Array, deterministic: bool,
                 biases: dict[str, Array] | None = None, segments: Array | None = None, g: Array | None = None,
                 allowed_g: Array | None = None, target_mapping: Array | None = None) -> tuple[Array, Array | None]:
        """(new content stream, new query stream or None)."""
        cfg = self.cfg
        query, key, value, position = (HeadsDense(no_bias(cfg), to_heads=True, name=n)
                                       for n in ("query", "key", "value", "position"))
        # [hidden, heads, kv] as both references keep it (XLNet's proj_o, Transformer-XL's o_net)
        output_kernel = self.param("output", init(cfg, ("embed", "heads", "kv"), 1.0, (1, 2), 0),
                                   (cfg.hidden_size, cfg.num_heads, cfg.head_dim))

        def output(ctx: Array) -> Array:
            return jnp.einsum("bqnd,end->bqe", ctx, output_kernel.astype(ctx.dtype))

        norm = layer_norm(cfg, "norm")
        if self.untie_r:
            biases = Biases(cfg, self.segment_term, name="biases")()
        segment = (self.param("segment", init(cfg, (None, "heads", "kv")), (2, cfg.num_heads, cfg.head_dim))
                   if self.segment_term else None)
        drop = nn.Dropout(cfg.attention_dropout_rate)  # built before the sublayers' dropouts: its name is fixed
        dropout = (None if deterministic or cfg.attention_dropout_rate == 0.0
                   else lambda probs: drop(probs, deterministic=False))

        keys_in = jnp.concatenate([memory.astype(h.dtype), h], axis=1)
        k, v, r = key(keys_in), value(keys_in), position(pos.astype(h.dtype))

        def stream(q: Array, mask: Array) -> Array:
            bias = self.score_terms(q, k, r, biases, segment, segments)
            return attend(q, k, v, allowed=mask[:, None], bias=bias, dropout=dropout, backend=cfg.attention_backend)

        h_out = sublayer_output(cfg, h, output(stream(query(h), allowed)), norm, deterministic)
        if g is None:
            return h_out, None
        mapping = target_mapping.astype(g.dtype)
        ctx = stream(jnp.einsum("bpnd,bpl->blnd", query(g), mapping), allowed_g)
        g_out = sublayer_output(cfg, g, output(jnp.einsum("blnd,bpl->bpnd", ctx, mapping)), norm, deterministic)
        return h_out, g_out
