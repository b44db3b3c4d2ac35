"""The Transformer core: mask kinds, block options, relative positions, KV cache, scanned layers.

References are independent: hand-built mask matrices, a float64 numpy forward pass, T5's bucket
rule written out per offset, and perturbation tests (a causal output must not move when a later
token changes).
"""

import dataclasses
import math
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from bertology.errors import UserError
from bertology.models.transformer import (
    Decoder,
    Encoder,
    EncoderDecoder,
    Mask,
    TransformerConfig,
    relative_bucket,
    shift_right,
    stack_layers,
)

V, L = 53, 10


def small(**kw) -> TransformerConfig:
    base = dict(vocab_size=V, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                max_position_embeddings=32, dropout_rate=0.0, attention_dropout_rate=0.0)
    return TransformerConfig(**{**base, **kw})


def unbox(tree):
    return nn.meta.unbox(tree)


def batch_of(rng, b=3, length=L, lengths=(L, 7, 4)):
    mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
    ids = (rng.integers(3, V, (b, length)) * mask).astype(np.int32)
    return {"input_ids": ids, "input_mask": mask}


# ---------------------------------------------------------------- mask kinds


def _lowered(mask: Mask, rows=None) -> np.ndarray:
    allowed, is_causal = mask.lower(rows)
    allowed = np.asarray(allowed)
    q = mask.keys.shape[1] if rows is None else np.asarray(rows).shape[1]
    allowed = np.broadcast_to(allowed, (allowed.shape[0], 1, q, mask.keys.shape[1]))[:, 0]
    if is_causal:
        allowed = allowed & np.tril(np.ones((q, mask.keys.shape[1]), bool))
    return allowed


def test_mask_kinds_against_hand_built_matrices():
    keys = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
    full = np.ones((5, 5), bool)
    tril = np.tril(full)
    # bidirectional: every query sees every real key
    expect = np.stack([np.tile(k, (5, 1)) for k in keys])
    np.testing.assert_array_equal(_lowered(Mask(keys=jnp.asarray(keys))), expect)
    # packed: and only its own document
    docs = np.array([[1, 1, 2, 2, 0], [1, 2, 2, 0, 0]])
    same = docs[:, :, None] == docs[:, None, :]
    np.testing.assert_array_equal(_lowered(Mask(keys=jnp.asarray(keys), documents=jnp.asarray(docs))),
                                  expect & same)
    # causal: and only the past
    np.testing.assert_array_equal(_lowered(Mask(keys=jnp.asarray(keys), causal=True)), expect & tril)
    # prefix: causal, but the first p keys are visible to every query
    prefix = np.array([3, 1])
    pre = np.stack([tril | (np.arange(5)[None, :] < p) for p in prefix])
    got = _lowered(Mask(keys=jnp.asarray(keys), prefix=jnp.asarray(prefix), causal=True))
    np.testing.assert_array_equal(got, expect & pre)
    assert got[0, 0, 2] and not got[0, 2, 3] and got[1, 1, 1] and not got[1, 0, 1]
    # explicit: any matrix
    explicit = np.random.default_rng(0).random((2, 5, 5)) < 0.5
    np.testing.assert_array_equal(_lowered(Mask(keys=jnp.asarray(keys), explicit=jnp.asarray(explicit))),
                                  expect & explicit)
    # rows: only the chosen queries, for every kind
    rows = np.array([[4, 1], [0, 2]])
    for mask in (Mask(keys=jnp.asarray(keys), documents=jnp.asarray(docs)),
                 Mask(keys=jnp.asarray(keys), causal=True),
                 Mask(keys=jnp.asarray(keys), prefix=jnp.asarray(prefix), causal=True),
                 Mask(keys=jnp.asarray(keys), explicit=jnp.asarray(explicit))):
        np.testing.assert_array_equal(_lowered(mask, jnp.asarray(rows)),
                                      np.take_along_axis(_lowered(mask), rows[:, :, None], axis=1))


def test_mask_from_batch_and_plain_causal_uses_is_causal():
    b = {"input_mask": np.ones((2, 4), np.int32)}
    assert Mask.from_batch(b, causal=True).lower()[1] is True  # no [B,1,L,L] array for plain causal
    assert Mask.from_batch(b).lower()[1] is False
    prefixed = Mask.from_batch({**b, "prefix_length": np.array([2, 3])})
    assert prefixed.causal and prefixed.lower()[1] is False


# ---------------------------------------------------------------- numpy reference of a stack


def _norm(x, p, cfg):
    if cfg.norm_kind == "rmsnorm":
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + cfg.layer_norm_eps) * p["scale"]
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + cfg.layer_norm_eps) * p["scale"] + p["bias"]


def _act(x, cfg):
    if cfg.activation == "relu":
        return np.maximum(x, 0)
    if cfg.activation == "gelu":
        return 0.5 * x * (1 + erf(x / np.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _dense(x, p, spec):
    return np.einsum(spec, x, p["kernel"]) + (p["bias"] if "bias" in p else 0.0)


def _t5_bucket(offset, bidirectional, buckets, max_distance):
    """T5's rule for one (key - query) offset, written out with Python scalars."""
    n, result = -offset, 0
    if bidirectional:
        buckets //= 2
        result = buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = buckets // 2
    if n < exact:
        return result + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact))
    return result + min(large, buckets - 1)


def numpy_stack(p, cfg, batch, causal):
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    ids, mask = batch["input_ids"], batch["input_mask"]
    n = ids.shape[1]
    x = p["embeddings"]["token"]["embedding"][ids]
    if cfg.positions == "absolute":
        x = x + p["embeddings"]["position"]["embedding"][np.arange(n)]
    if cfg.type_vocab_size:
        x = x + p["embeddings"]["segment"]["embedding"][0]
    if cfg.embedding_norm:
        x = _norm(x, p["embeddings"]["norm"], cfg)
    allowed = (mask[:, None, None, :] > 0) & (np.tril(np.ones((n, n), bool)) if causal else True)
    bias = 0.0
    if cfg.positions == "relative_bias":
        buckets = np.array([[_t5_bucket(k - q, not causal, cfg.relative_buckets, cfg.relative_max_distance)
                             for k in range(n)] for q in range(n)])
        bias = np.transpose(p["relative_bias"]["embedding"][buckets], (2, 0, 1))[None]
    pre = cfg.norm == "pre"
    for i in range(cfg.num_layers):
        a, f = p[f"attention_{i}"], p[f"ffn_{i}"]
        h = _norm(x, a["norm"], cfg) if pre else x
        q, k, v = (_dense(h, a[m], "bld,dhk->blhk") for m in ("query", "key", "value"))
        s = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(cfg.head_dim) + bias
        s = np.where(allowed, s, -1e30)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out = _dense(np.einsum("bhqt,bthk->bqhk", w, v), a["output"], "bqhk,hkd->bqd")
        x = x + out if pre else _norm(x + out, a["norm"], cfg)
        h = _norm(x, f["norm"], cfg) if pre else x
        g = _act(_dense(h, f["intermediate"], "bld,df->blf"), cfg)
        if cfg.activation == "gated_gelu":
            g = g * _dense(h, f["intermediate_linear"], "bld,df->blf")
        out = _dense(g, f["output"], "blf,fd->bld")
        x = x + out if pre else _norm(x + out, f["norm"], cfg)
    if pre:
        x = _norm(x, p["final_norm"], cfg)
    return x


VARIANTS = [
    dict(),  # BERT: post-LN, GELU, learned positions
    dict(norm="pre", activation="gelu_tanh", type_vocab_size=0, embedding_norm=False),  # GPT-2
    dict(norm="pre", norm_kind="rmsnorm", use_bias=False, activation="gated_gelu", positions="relative_bias",
         type_vocab_size=0, embedding_norm=False, relative_buckets=8, relative_max_distance=16),  # T5 v1.1
    dict(activation="relu", positions="none", type_vocab_size=0),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=["bert", "gpt2", "t5", "relu_nopos"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_stack_matches_numpy_reference(variant, causal):
    cfg = small(**variant, pooler=False)
    batch = batch_of(np.random.default_rng(0))
    module = Decoder(cfg) if causal else Encoder(cfg)
    params = unbox(module.init(jax.random.key(0), batch)["params"])
    if not cfg.use_bias:
        assert not any("bias" in jax.tree_util.keystr(p) and "relative" not in jax.tree_util.keystr(p)
                       for p, _ in jax.tree_util.tree_leaves_with_path(params))
    got = np.asarray(module.apply({"params": params}, batch)["sequence"])
    want = numpy_stack(params, cfg, batch, causal)
    real = batch["input_mask"] > 0
    np.testing.assert_allclose(got[real], want[real], atol=2e-5)


def test_relative_buckets_follow_t5_rule():
    offsets = np.arange(-300, 301)
    for bidirectional in (True, False):
        got = np.asarray(relative_bucket(jnp.asarray(offsets), bidirectional, 32, 128))
        want = [_t5_bucket(int(o), bidirectional, 32, 128) for o in offsets]
        np.testing.assert_array_equal(got, want)


def test_sinusoidal_positions_are_the_papers_fixed_table():
    """positions="sinusoidal" (Vaswani et al. 2017, §3.5): no position parameters, and the same
    outputs as a learned table holding PE(pos, 2i) = sin(pos / 10000^(2i/d)) and
    PE(pos, 2i + 1) = cos(pos / 10000^(2i/d)) (stored as the sine half, then the cosine half)."""
    from bertology.models.transformer import sinusoid

    d = 32
    pos, i = np.arange(20)[:, None], np.arange(0, d, 2)[None]
    paper = np.zeros((20, d))
    paper[:, 0::2], paper[:, 1::2] = np.sin(pos / 10000 ** (i / d)), np.cos(pos / 10000 ** (i / d))
    halves = np.asarray(sinusoid(jnp.arange(20.0), d))
    np.testing.assert_allclose(halves, np.concatenate([paper[:, 0::2], paper[:, 1::2]], -1), atol=1e-5)

    batch = batch_of(np.random.default_rng(0))
    fixed = small(positions="sinusoidal", hidden_size=d, intermediate_size=64)
    params = unbox(Encoder(fixed).init(jax.random.key(0), batch)["params"])
    assert "position" not in params["embeddings"]
    learned = dataclasses.replace(fixed, positions="absolute")
    table = {**params, "embeddings": {**params["embeddings"], "position": {"embedding": sinusoid(
        jnp.arange(float(learned.max_position_embeddings)), d)}}}
    np.testing.assert_allclose(Encoder(fixed).apply({"params": params}, batch)["sequence"],
                               Encoder(learned).apply({"params": table}, batch)["sequence"], atol=1e-5)


def test_gpt2_residual_init_scaling():
    layers = 6
    cfg = small(num_layers=layers, hidden_size=64, intermediate_size=256, scale_residual_init=True, initializer_range=0.02)
    params = unbox(Decoder(cfg).init(jax.random.key(0), batch_of(np.random.default_rng(0)))["params"])
    # truncated normal at 2 std: its std is 0.88 of the nominal one
    residual = np.concatenate([np.ravel(params[f"{m}_{i}"]["output"]["kernel"]) for i in range(layers) for m in ("attention", "ffn")])
    other = np.concatenate([np.ravel(params[f"attention_{i}"]["query"]["kernel"]) for i in range(layers)])
    assert np.std(residual) / np.std(other) == pytest.approx(1 / np.sqrt(2 * layers), rel=0.05)


# ---------------------------------------------------------------- causality, prefix, cache


def test_causal_and_prefix_outputs_ignore_what_they_must_not_see():
    cfg = small(norm="pre", type_vocab_size=0)
    rng = np.random.default_rng(1)
    batch = batch_of(rng, lengths=(L, L, L))
    model = Decoder(cfg)
    params = model.init(jax.random.key(0), batch)["params"]
    changed = {**batch, "input_ids": batch["input_ids"].copy()}
    changed["input_ids"][:, 6] = (changed["input_ids"][:, 6] + 1) % V
    run = lambda b: np.asarray(model.apply({"params": params}, b)["sequence"])  # noqa: E731
    a, b = run(batch), run(changed)
    np.testing.assert_array_equal(a[:, :6], b[:, :6])  # before the change: bit-identical
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-4
    # prefix rows: a change inside the prefix reaches every position; after it, only later ones
    prefix = {"prefix_length": np.array([8, 8, 3])}
    a, b = run({**batch, **prefix}), run({**changed, **prefix})
    assert np.abs(a[:2, :6] - b[:2, :6]).max() > 1e-4  # position 6 is inside the first two prefixes
    np.testing.assert_array_equal(a[2, :6], b[2, :6])


def test_kv_cache_decoding_equals_the_full_pass():
    """Left-padded prompts, then tokens one at a time against the cache: the logits of every new
    position equal a full forward over the whole sequence."""
    cfg = small(norm="pre", type_vocab_size=0, positions="relative_bias", relative_buckets=8)
    rng = np.random.default_rng(2)
    total, prompt = 9, 5
    ids = rng.integers(3, V, (2, total)).astype(np.int32)
    mask = np.ones((2, total), np.int32)
    mask[1, :2] = 0  # row 1 is left-padded by two
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
    model = Decoder(cfg)
    params = model.init(jax.random.key(0), {"input_ids": ids, "input_mask": mask})["params"]
    full = np.asarray(model.apply({"params": params}, {"input_ids": ids, "input_mask": mask, "positions": positions})["sequence"])
    cache = model.init(jax.random.key(0), {"input_ids": ids, "input_mask": mask}, decode=True)["cache"]
    steps = [slice(0, prompt)] + [slice(t, t + 1) for t in range(prompt, total)]
    for s in steps:
        piece = {"input_ids": ids[:, s], "input_mask": mask[:, s], "positions": positions[:, s]}
        out, variables = model.apply({"params": params, "cache": cache}, piece, decode=True, mutable=["cache"])
        cache = variables["cache"]
        real = mask[:, s] > 0
        np.testing.assert_allclose(np.asarray(out["sequence"])[real], full[:, s][real], atol=1e-5)


def test_encoder_decoder_cross_attention_and_cache():
    cfg = small(norm="pre", type_vocab_size=0)
    rng = np.random.default_rng(3)
    src = batch_of(rng, lengths=(L, 6, 3))
    tgt = rng.integers(3, V, (3, 6)).astype(np.int32)
    batch = {**src, "decoder_input_ids": shift_right(jnp.asarray(tgt), 1), "decoder_input_mask": np.ones((3, 6), np.int32)}
    model = EncoderDecoder(cfg)
    params = model.init(jax.random.key(0), batch)["params"]
    assert "embeddings" not in params["decoder"]  # one token table, the encoder's
    full = np.asarray(model.apply({"params": params}, batch))
    # the decoder reads the source: changing a real source token moves it, a padded one does not
    moved = {**batch, "input_ids": batch["input_ids"].copy()}
    moved["input_ids"][1, 2] += 1
    assert np.abs(np.asarray(model.apply({"params": params}, moved))[1] - full[1]).max() > 1e-4
    padded = {**batch, "input_ids": batch["input_ids"].copy()}
    padded["input_ids"][2, 8] += 1
    np.testing.assert_array_equal(np.asarray(model.apply({"params": params}, padded)), full)
    # incremental decoding with cached self- and cross-attention keys equals teacher forcing
    encoded = model.apply({"params": params}, batch, method="encode")
    cache = model.init(jax.random.key(0), batch, encoded, batch["input_mask"], decode=True, method="decode")["cache"]
    for t in range(6):
        step = {"decoder_input_ids": batch["decoder_input_ids"][:, t:t + 1],
                "decoder_input_mask": np.ones((3, 1), np.int32), "decoder_positions": np.full((3, 1), t, np.int32)}
        out, variables = model.apply({"params": params, "cache": cache}, step, encoded, batch["input_mask"],
                                     decode=True, method="decode", mutable=["cache"])
        cache = variables["cache"]
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[:, t], atol=1e-5)


@pytest.mark.parametrize("variant", [dict(), dict(norm="pre", norm_bias=False, type_vocab_size=0, embedding_norm=False)],
                         ids=["post_ln", "pre_ln_no_bias"])
def test_written_out_layer_norm_equals_flax(variant):
    """`model.norm_backward=written_out`: the same parameters, outputs and gradients as flax's
    LayerNorm (float32; its backward pass is written out by hand, so the gradients are the test)."""
    cfg = small(**variant, pooler=False)
    written = dataclasses.replace(cfg, norm_backward="written_out")
    batch = batch_of(np.random.default_rng(5))
    params = unbox(Encoder(cfg).init(jax.random.key(0), batch)["params"])
    # scales and biases away from 1 and 0, so their gradients and effect are tested too
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.1 * jax.random.normal(jax.random.key(zlib.crc32(jax.tree_util.keystr(path).encode())),
                                                    x.shape)
        if "norm" in jax.tree_util.keystr(path) else x, params)
    assert jax.tree.map(np.shape, unbox(Encoder(written).init(jax.random.key(0), batch)["params"])) == \
        jax.tree.map(np.shape, params)

    def loss(c, p):
        return jnp.sum(jnp.sin(Encoder(c).apply({"params": p}, batch)["sequence"]))

    a, ga = jax.jit(jax.value_and_grad(lambda p: loss(cfg, p)))(params)
    b, gb = jax.jit(jax.value_and_grad(lambda p: loss(written, p)))(params)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)  # a sum of ~500 sines: absolute rounding
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ga))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * scale), ga, gb)
    norms = [g for path, g in jax.tree_util.tree_leaves_with_path(gb) if "norm" in jax.tree_util.keystr(path)]
    assert norms and all(float(np.max(np.abs(g))) > 1e-3 for g in norms)  # every norm's gradient is live


# ---------------------------------------------------------------- scanned layers


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_stack_equals_unscanned(causal, remat):
    cfg = small(num_layers=3, norm="pre" if causal else "post", remat=remat, dropout_rate=0.1)
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
    make = Decoder if causal else Encoder
    batch = batch_of(np.random.default_rng(4))
    params = unbox(make(cfg).init(jax.random.key(0), batch)["params"])
    scanned = stack_layers(params, 3)
    boxed = make(scanned_cfg).init(jax.random.key(0), batch)["params"]
    assert jax.tree.map(np.shape, unbox(boxed)) == jax.tree.map(np.shape, scanned)
    assert boxed["layers"]["attention"]["query"]["kernel"].names[0] == "layers"

    def loss(model, p):
        out = model.apply({"params": p}, batch)
        return jnp.sum(out["sequence"] ** 2) + sum(jnp.sum(x) for x in out["layers"])

    a, ga = jax.jit(jax.value_and_grad(lambda p: loss(make(cfg), p)))(params)
    b, gb = jax.jit(jax.value_and_grad(lambda p: loss(make(scanned_cfg), p)))(scanned)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ga))  # key biases' gradients are rounding noise
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6 * scale), stack_layers(ga, 3), gb)
    if not causal:  # the gathered last layer equals the scanned full layer + gather
        rows = jnp.asarray([[1, 2], [0, 5], [3, 3]])
        x = make(cfg).apply({"params": params}, batch, outputs_at=rows)["sequence"]
        y = make(scanned_cfg).apply({"params": scanned}, batch, outputs_at=rows)["sequence"]
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_config_errors_are_one_line():
    with pytest.raises(UserError, match="scan_layers"):
        small(scan_layers=True, share_layers="all")
    with pytest.raises(UserError, match="norm="):
        small(norm="sandwich")
    with pytest.raises(UserError, match="positions="):
        small(positions="alibi")  # rotary is a setting since ModernBERT
    with pytest.raises(UserError, match="norm_backward='written_out'.*rmsnorm"):
        small(norm_kind="rmsnorm", norm_backward="written_out")
