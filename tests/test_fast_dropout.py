"""The core's training-speed paths: hashed dropout and blocked causal attention.

Dropout is checked as a Bernoulli process (drop rate, unbiased mean, independence of neighbours
and of calls) with binomial bounds; blocked causal attention against the full square computed by
`jax.nn.dot_product_attention`, values and gradients, with padding and packed documents.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertology.models.attention import causal_blocks
from bertology.models.transformer import Decoder, Dropout, TransformerConfig


def _drop(x, rate, seed=0, deterministic=False):
    return Dropout(rate).apply({}, x, deterministic, rngs={"dropout": jax.random.key(seed)})


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_rate_and_mean_are_bernoullis(rate):
    n = 1 << 20
    out = np.asarray(_drop(jnp.ones((16, n // 16)), rate))
    dropped = out == 0
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(dropped.mean() - rate) < 5 * sigma
    assert abs(out.mean() - 1.0) < 5 * sigma / (1 - rate)  # kept values are scaled by ~1/(1 - rate)
    assert np.allclose(out[~dropped], 1 / (1 - rate), rtol=1e-4)
    # the two draws of one hash word (neighbours on the last axis) and rows are independent
    pairs = dropped.reshape(-1, 2)
    assert abs((pairs[:, 0] & pairs[:, 1]).mean() - rate ** 2) < 5 * np.sqrt(rate ** 2 / pairs.shape[0])
    assert abs((dropped[0] & dropped[1]).mean() - rate ** 2) < 5 * np.sqrt(rate ** 2 / dropped.shape[1])


def test_dropout_masks_differ_by_key_and_repeat_with_it():
    x = jnp.ones((64, 1024))
    a, b = np.asarray(_drop(x, 0.3, seed=1)) == 0, np.asarray(_drop(x, 0.3, seed=2)) == 0
    assert (a == (np.asarray(_drop(x, 0.3, seed=1)) == 0)).all()
    n = a.size
    assert abs((a & b).mean() - 0.09) < 5 * np.sqrt(0.09 / n)  # independent masks, not shifted copies


def test_dropout_is_identity_when_deterministic_and_handles_odd_shapes():
    x = jnp.arange(15.0).reshape(3, 5)
    assert (np.asarray(_drop(x, 0.5, deterministic=True)) == np.asarray(x)).all()
    assert (np.asarray(_drop(x, 0.0)) == np.asarray(x)).all()
    assert (np.asarray(_drop(x, 1.0)) == 0).all()
    out = np.asarray(_drop(jnp.ones((7, 999)), 0.25))
    assert abs((out == 0).mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / out.size)


def test_causal_blocks_are_divisors_of_at_least_128_queries():
    assert [causal_blocks(n) for n in (1024, 512, 384, 256, 200, 128, 16)] == [8, 4, 2, 2, 1, 1, 1]


@pytest.mark.parametrize("length", [256, 1024])
def test_blocked_causal_attention_equals_the_full_square(length):
    """The explicit path (taken in training, with attention dropout) runs a causal square in
    query blocks; at a rate that drops nothing (threshold 0) it must give the fused full-square
    kernel's outputs and gradients, with padding and two packed documents."""
    assert causal_blocks(length) > 1
    cfg = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                            max_position_embeddings=length, type_vocab_size=0, norm="pre", dropout_rate=0.0,
                            attention_dropout_rate=0.0, embedding_norm=False)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (2, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, length - 37:] = 0
    docs = np.where(np.arange(length) < length // 3 + 5, 1, 2)[None].repeat(2, 0).astype(np.int32)
    batch = {"input_ids": ids, "input_mask": mask, "packing_ids": docs}
    fused = Decoder(cfg)
    params = jax.jit(fused.init)(jax.random.key(0), batch)["params"]
    blocked = Decoder(dataclasses.replace(cfg, attention_dropout_rate=1e-9))  # drops nothing, takes the explicit path

    def out(model, p, deterministic):
        seq = model.apply({"params": p}, batch, deterministic=deterministic, rngs={"dropout": jax.random.key(1)})
        return jnp.sum(jnp.sin(seq["sequence"]) * mask[..., None])

    ref, grads = jax.jit(jax.value_and_grad(lambda p: out(fused, p, True)))(params)  # jitted: op by op took ~30 s
    got, got_grads = jax.jit(jax.value_and_grad(lambda p: out(blocked, p, False)))(params)
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    got_grads, grads = jax.tree.leaves(nn.meta.unbox(got_grads)), jax.tree.leaves(nn.meta.unbox(grads))
    scale = max(float(np.abs(r).max()) for r in grads)  # float32 sums in another order: errors relative to it
    for g, r in zip(got_grads, grads):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6 * scale)
