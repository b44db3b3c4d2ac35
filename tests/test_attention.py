"""`attention.attend`, the one softmax attention every family runs through, against a float64
numpy reference (softmax over the allowed scale·q·k + bias, then the values): padding masks,
causal squares (the explicit path in query blocks, and the fused kernel), additive score terms,
a query with no allowed key, the dropout hook, and the two paths against each other."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertology.models.attention import attend, causal_blocks, scores

B, H, D = 2, 3, 8


def reference(q, k, v, allowed=None, bias=None, scale=None, causal=False, after_softmax=None):
    """float64: softmax over the allowed keys of scale·q·k + bias (a row with none: uniform), an
    optional elementwise factor on the probabilities (what a dropout mask does), times v."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    ok = np.ones(s.shape, bool) if allowed is None else np.broadcast_to(np.asarray(allowed), s.shape)
    if causal:
        ok = ok & (np.arange(s.shape[2])[:, None] >= np.arange(s.shape[3])[None, :])
    s = np.where(ok, s, -1e300)  # finite: a row with no allowed key comes out uniform
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if after_softmax is not None:
        p = p * after_softmax
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def qkv(seed, qlen, klen=None):
    rng = np.random.default_rng(seed)
    klen = qlen if klen is None else klen
    return (jnp.asarray(rng.normal(size=(B, n, H, D)), jnp.float32) for n in (qlen, klen, klen))


def both(q, k, v, **kw):
    """(fused, explicit): the explicit path taken with a dropout that drops nothing."""
    return attend(q, k, v, **kw), attend(q, k, v, dropout=lambda p: p, **kw)


def padding(klen, lengths):
    return (np.arange(klen)[None] < np.array(lengths)[:, None])[:, None, None, :]  # [batch, 1, 1, keys]


@pytest.mark.parametrize("qlen,klen", [(7, 7), (5, 11)])
def test_padding_mask_matches_reference(qlen, klen):
    q, k, v = qkv(0, qlen, klen)
    allowed = padding(klen, [klen, klen - 4])
    want = reference(q, k, v, allowed)
    for got in both(q, k, v, allowed=jnp.asarray(allowed)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # the padded keys matter: without the mask the second row differs
    assert np.abs(np.asarray(attend(q, k, v))[1] - want[1]).max() > 1e-3


@pytest.mark.parametrize("length", [16, 256])
def test_causal_blocked_explicit_and_fused_match_reference(length):
    """256 queries run in 2 blocks on the explicit path; 16 in one."""
    assert causal_blocks(length) == (2 if length == 256 else 1)
    q, k, v = qkv(1, length)
    allowed = padding(length, [length, length - 37])
    want = reference(q, k, v, allowed, causal=True)
    fused, explicit = both(q, k, v, allowed=jnp.asarray(allowed), is_causal=True)
    np.testing.assert_allclose(np.asarray(fused), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(explicit), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(explicit), np.asarray(fused), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
@pytest.mark.parametrize("bias_rows", [1, B])
def test_additive_bias_and_scale_match_reference(scale, bias_rows):
    """The score-term hook: a [1|batch, heads, q, k] term added after scaling q·k (T5's buckets,
    XL's pre-scaled position terms), with any scale (None: 1/sqrt(head width); T5: 1)."""
    q, k, v = qkv(2, 6, 9)
    bias = np.random.default_rng(3).normal(size=(bias_rows, H, 6, 9)).astype(np.float32)
    allowed = padding(9, [9, 5])
    want = reference(q, k, v, allowed, bias, scale)
    for got in both(q, k, v, allowed=jnp.asarray(allowed), bias=jnp.asarray(bias), scale=scale):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert np.abs(want - reference(q, k, v, allowed, None, scale)).max() > 1e-2  # the bias is felt


def test_prescaled_terms_reproduce_a_biased_query():
    """What XL relies on: softmax((q + r)·k / sqrt(d)) is attend(q, k, v) with bias r·k / sqrt(d)."""
    q, k, v = qkv(4, 5, 8)
    r = jnp.asarray(np.random.default_rng(5).normal(size=(H, D)), jnp.float32)
    bias = jnp.einsum("nd,bknd->bnk", r, k)[:, :, None, :] * D ** -0.5
    want = reference(q + r, k, v)
    for got in both(q, k, v, bias=bias):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_a_query_with_no_allowed_key_averages_all_values():
    """Defined today on both paths (and XL's former -1e30 fill): a uniform softmax, not NaN."""
    q, k, v = qkv(6, 4, 6)
    allowed = np.ones((B, 1, 4, 6), bool)
    allowed[0, :, 2] = False
    allowed[1, :, :, 3:] = False
    want = reference(q, k, v, allowed)
    np.testing.assert_allclose(want[0, 2], np.broadcast_to(np.asarray(v[0], np.float64).mean(0), (H, D)), atol=1e-12)
    for got in both(q, k, v, allowed=jnp.asarray(allowed)):
        got = np.asarray(got)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_dropout_sees_the_normalised_float32_probabilities(is_causal):
    """The hook is applied after the softmax, to float32 probabilities (in blocks for a causal
    square, whose keys run from 0): a fixed factor per key gives the reference with that factor
    on its probabilities, not renormalised."""
    length = 256
    q, k, v = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in qkv(7, length))
    seen = []

    def dropout(p):
        seen.append(p.dtype)
        return p * jnp.where(jnp.arange(p.shape[-1]) % 3 == 0, 0.0, 1.5)

    factor = np.where(np.arange(length) % 3 == 0, 0.0, 1.5)
    want = reference(q, k, v, causal=is_causal, after_softmax=factor)
    got = attend(q, k, v, is_causal=is_causal, dropout=dropout)
    assert seen == [jnp.float32] * (2 if is_causal else 1)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_fused_and_explicit_agree_in_values_and_gradients():
    q, k, v = qkv(8, 32, 40)
    allowed = jnp.asarray(np.random.default_rng(9).random((B, 1, 32, 40)) < 0.8)
    bias = jnp.asarray(np.random.default_rng(10).normal(size=(1, H, 32, 40)), jnp.float32)

    def loss(dropout, q, k, v, bias):
        return jnp.sum(jnp.sin(attend(q, k, v, allowed=allowed, bias=bias, dropout=dropout)))

    fused = jax.value_and_grad(lambda *a: loss(None, *a), argnums=(0, 1, 2, 3))(q, k, v, bias)
    explicit = jax.value_and_grad(lambda *a: loss(lambda p: p, *a), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(explicit)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_scores_are_the_scaled_unmasked_logits():
    """What TinyBERT's distillation reads: float32 scale·q·k + bias, no mask."""
    q, k, _ = qkv(11, 3, 4)
    bias = np.random.default_rng(12).normal(size=(1, H, 3, 4)).astype(np.float32)
    qk = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))
    got = scores(q, k, jnp.asarray(bias))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), qk / np.sqrt(D) + bias, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(scores(q, k, scale=1.0)), qk, rtol=1e-5, atol=1e-5)
