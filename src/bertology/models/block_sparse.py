"""Block-sparse self-attention: BigBird's ITC pattern (Zaheer et al. 2020, "Big Bird:
Transformers for Longer Sequences", arXiv 2007.14062, section 2 and appendix D), computed as
Hugging Face's `BigBirdBlockSparseAttention` (transformers 4.57.6, `modeling_big_bird.py`) does.

The row is cut into n blocks of `block` tokens. Query blocks 0 and n-1 are global: they attend to
every key. Every other query block i attends to
- the global key blocks 0 and n-1,
- the sliding window of 3 blocks: i-1, i, i+1,
- `r` random key blocks (per head): `random[h, i-1]`.
So each middle query sees (5 + r)·block keys and the whole layer costs O(L·block) memory: the key
blocks each query block needs are gathered ([batch, heads, n-2, 5+r, block, head_dim]); no
[L, L] score matrix is ever formed. For query block 1 the window's left block is global block 0,
and for block n-2 its right block is global block n-1: HF lists each of them once there, so the
duplicate slot is masked (`slot_mask`).

Random blocks, as HF computes them:
- in evaluation (`deterministic`), transformers 4.57.6 draws none: `_bigbird_block_rand_mask_with_head`
  returns its zero-initialised table when `not self.training`, so every random slot of every
  middle query block points at key block 0. Block 0 is then counted r + 1 times in the softmax
  (its keys weigh (r + 1)·exp(score)). `eval_random_blocks` is that table, and evaluation uses it,
  so outputs match HF's evaluation mode;
- in training HF reseeds numpy with the layer index on every call (`np.random.seed(self.seed)`,
  so a layer's pattern is fixed) and draws blocks outside the window and the global blocks,
  following the reference code's plans (`_get_rand_attn_plan`; at 1024, 3072 and 4096 tokens the
  paper's, which draw among the first 1024 tokens only). Here training draws them afresh each
  step from the `dropout` rng (`draw_random_blocks`), uniformly without replacement over the
  whole row's legal blocks: outside the window, not global, and (HF's
  `_get_single_block_row_attention`) block 1 never taking n-2, nor n-2 block 1. So training
  patterns are the paper's kind, not HF's exact draws; only evaluation is HF's to the number.

HF also has no dropout on the block-sparse probabilities, zeroes the output at padded query
positions (`context_layer * from_mask`), pads a row to a multiple of `block` with masked keys,
and computes full attention when the row is too short for the pattern (`too_short`:
L <= (5 + 2r)·block, HF's `max_tokens_to_attend`). `attend` does the first three; the caller
(`transformer.Attention`) the fourth.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def too_short(length: int, block: int, num_random: int) -> bool:
    """Whether a row of `length` tokens gets full attention instead: HF's `max_tokens_to_attend`
    (2 global + 3 window + 2r blocks, r of them a margin so that random draws always find legal
    blocks)."""
    return length <= (5 + 2 * num_random) * block


def key_blocks(random: Array) -> Array:
    """[heads, n-2, 5 + r]: the key blocks middle query block i (row i-1) gathers, in HF's
    order: global 0, window i-1, i, i+1, the r random ones, global n-1. `random`: [heads, n-2, r]."""
    heads, middle, _ = random.shape
    n = middle + 2
    i = jnp.arange(1, n - 1)
    fixed = jnp.stack([jnp.zeros_like(i), i - 1, i, i + 1], axis=-1)
    last = jnp.full((middle, 1), n - 1, i.dtype)
    return jnp.concatenate([jnp.broadcast_to(fixed, (heads, middle, 4)), random.astype(i.dtype),
                            jnp.broadcast_to(last, (heads, middle, 1))], axis=-1)


def slot_mask(n: int, num_random: int) -> np.ndarray:
    """[n-2, 5 + r] bool: False at the window slots that repeat a global block (block 1's left
    neighbour is block 0, block n-2's right neighbour is block n-1), which HF lists only once."""
    ok = np.ones((n - 2, 5 + num_random), bool)
    ok[0, 1] = False
    ok[-1, 3] = False
    return ok


def eval_random_blocks(heads: int, n: int, num_random: int) -> Array:
    """HF's evaluation-mode table (transformers 4.57.6): every random slot is block 0."""
    return jnp.zeros((heads, n - 2, num_random), jnp.int32)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def draw_random_blocks(rng: Array, heads: int, n: int, num_random: int) -> Array:
    """[heads, n-2, r] random key blocks for middle query blocks 1..n-2, distinct within a row,
    none global (0, n-1) or in the row's window (i-1..i+1), and (HF's rule) block 1 never taking
    n-2 nor block n-2 taking 1. Uniform without replacement: the top r of uniform noise over the
    legal blocks."""
    i = np.arange(1, n - 1)[:, None]
    j = np.arange(n)[None, :]
    legal = (j > 0) & (j < n - 1) & (np.abs(j - i) > 1)
    legal &= ~((i == 1) & (j == n - 2)) & ~((i == n - 2) & (j == 1))
    if (legal.sum(-1) < num_random).any():
        raise ValueError(f"{n} blocks leave fewer than {num_random} legal random blocks for some query block")
    noise = jax.random.uniform(rng, (heads, n - 2, n))
    return jax.lax.top_k(jnp.where(jnp.asarray(legal), noise, -1.0), num_random)[1].astype(jnp.int32)


def attend(q: Array, k: Array, v: Array, keys: Array, *, block: int, random: Array,
           scale: float | None = None) -> Array:
    """Block-sparse softmax(scale · q·k) · v, [batch, length, heads, head_dim] in and out.

    `keys` ([batch, length] bool) is the padding mask of this self-attention's tokens: masked
    keys weigh nothing and a padded query's output is zero (HF's `from_mask`). `random`
    ([heads, n-2, r], n the blocks of the padded row): each middle query block's random key
    blocks (`eval_random_blocks`, `draw_random_blocks`). `scale` None: 1/sqrt(head_dim).
    A length that `block` does not divide is padded with masked keys and cut back after.
    """
    batch, length, heads, width = q.shape
    pad = -length % block
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        keys = jnp.pad(keys, ((0, 0), (0, pad)))
    n = (length + pad) // block
    if random.shape[:2] != (heads, n - 2):
        raise ValueError(f"random blocks {random.shape} for {heads} heads and {n} blocks: need [heads, n-2, r]")
    scale = width ** -0.5 if scale is None else scale
    low = jnp.finfo(jnp.float32).min

    def softmax_values(s: Array, visible: Array, values: Array, spec: str) -> Array:
        s = jnp.where(visible, s.astype(jnp.float32) * scale, low)
        return jnp.einsum(spec, jax.nn.softmax(s, axis=-1).astype(v.dtype), values)

    # global query blocks 0 and n-1: every key
    g = jnp.concatenate([q[:, :block], q[:, -block:]], axis=1)  # [batch, 2·block, heads, d]
    glob = softmax_values(jnp.einsum("bqhd,bkhd->bhqk", g, k), keys[:, None, None, :], v, "bhqk,bkhd->bqhd")

    # middle query blocks 1..n-2: 5 + r gathered key blocks each
    idx = key_blocks(random)  # [heads, n-2, S]
    by_head = lambda x: x.reshape(batch, n, block, heads, width).transpose(3, 0, 1, 2, 4)  # noqa: E731
    gather = jax.vmap(lambda x, i: x[:, i], in_axes=(0, 0))  # per head: [batch, n, ...] at [n-2, S]
    kg, vg = gather(by_head(k), idx), gather(by_head(v), idx)  # [heads, batch, n-2, S, block, d]
    visible = gather(jnp.broadcast_to(keys.reshape(1, batch, n, block), (heads, batch, n, block)), idx)
    visible = visible & jnp.asarray(slot_mask(n, random.shape[-1]))[None, None, :, :, None]
    qm = q.reshape(batch, n, block, heads, width)[:, 1:-1]  # [batch, n-2, block, heads, d]
    s = jnp.einsum("bnqhd,hbnskd->hbnqsk", qm, kg)
    s = s.reshape(*s.shape[:4], -1)  # [heads, batch, n-2, block, S·block]
    vis = visible.reshape(heads, batch, n - 2, 1, -1)
    middle = softmax_values(s, vis, vg.reshape(heads, batch, n - 2, -1, width), "hbnqk,hbnkd->bnqhd")

    out = jnp.concatenate([glob[:, :block], middle.reshape(batch, -1, heads, width), glob[:, block:]], axis=1)
    out = jnp.where(keys[:, :, None, None], out, jnp.zeros((), out.dtype))
    return out[:, :length]


def pattern(random: Array) -> np.ndarray:
    """[heads, n, n] int: how many times query block i counts key block j in its softmax (the
    global rows see each block once; a middle row its 5 + r slots, duplicates masked as in
    `attend`): the dense picture of the pattern, for tests and plots."""
    heads, middle, r = random.shape
    n = middle + 2
    counts = np.zeros((heads, n, n), np.int64)
    counts[:, 0] = counts[:, -1] = 1
    idx, ok = np.asarray(key_blocks(jnp.asarray(random))), slot_mask(n, r)
    for h in range(heads):
        for row in range(middle):
            for slot in np.flatnonzero(ok[row]):
                counts[h, row + 1, idx[h, row, slot]] += 1
    return counts
