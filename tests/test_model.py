"""The encoder and BERT heads against an independent float64 numpy forward pass."""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import np_gelu, np_layer_norm

from bertology.errors import UserError
from bertology.families.bert import model as bert
from bertology.models.presets import BERT_SIZES, bert_preset
from bertology.models.transformer import TransformerConfig

B, L, P, V = 3, 16, 4, 97


def _batch(rng):
    lengths = np.array([L, 11, 6])
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, V, (B, L)) * mask
    seg = ((np.arange(L)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
    pos = np.stack([np.sort(rng.choice(n, P, replace=False)) for n in lengths]).astype(np.int32)
    return dict(input_ids=ids.astype(np.int32), input_mask=mask, segment_ids=seg, masked_positions=pos)


def _dense(x, p, spec):
    return np.einsum(spec, x, p["kernel"]) + p["bias"]


def numpy_bert(p, cfg, batch):
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    e = p["encoder"]["embeddings"]
    ids, mask, seg = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    x = e["token"]["embedding"][ids] + e["position"]["embedding"][np.arange(L)] + e["segment"]["embedding"][seg]
    x = np_layer_norm(x, e["norm"])
    for i in range(cfg.num_layers):
        a = p["encoder"][f"attention_{i}"]
        q, k, v = (_dense(x, a[n], "bld,dhk->blhk") for n in ("query", "key", "value"))
        s = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(cfg.head_dim)
        s = s + np.where(mask[:, None, None, :] > 0, 0.0, -1e30)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        ctx = np.einsum("bhqt,bthk->bqhk", w, v)
        x = np_layer_norm(x + _dense(ctx, a["output"], "bqhk,hkd->bqd"), a["norm"])
        f = p["encoder"][f"ffn_{i}"]
        h = np_gelu(_dense(x, f["intermediate"], "bld,df->blf"))
        x = np_layer_norm(x + _dense(h, f["output"], "blf,fd->bld"), f["norm"])
    pooled = np.tanh(_dense(x[:, 0], p["encoder"]["pooler"], "bd,de->be"))
    hidden = np.take_along_axis(x, batch["masked_positions"][..., None], axis=1)
    t = np_layer_norm(np_gelu(_dense(hidden, p["mlm"]["transform"], "bpd,de->bpe")), p["mlm"]["norm"])
    mlm = t @ e["token"]["embedding"].T + p["mlm"]["bias"]
    nsp = _dense(pooled, p["nsp"]["dense"], "bd,dc->bc")
    return x, mlm, nsp


def _perturbed(params, key):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [l + 0.1 * jax.random.normal(k, l.shape) for l, k in zip(leaves, keys)])


def test_bert_matches_numpy_reference():
    cfg = TransformerConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_position_embeddings=L)
    batch = _batch(np.random.default_rng(0))
    model = bert.Model(cfg)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(1), batch)["params"])
    # Give biases and LayerNorm parameters non-trivial values, so they are exercised too.
    params = jax.jit(_perturbed)(params, jax.random.key(2))
    out = jax.jit(model.apply)({"params": params}, batch)
    _, mlm, nsp = numpy_bert(params, cfg, batch)
    np.testing.assert_allclose(out["mlm_logits"], mlm, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(out["nsp_logits"], nsp, atol=2e-4, rtol=1e-4)


def test_padding_does_not_leak_into_real_positions():
    cfg = TransformerConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_position_embeddings=L)
    batch = _batch(np.random.default_rng(3))
    model = bert.Model(cfg)
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    other = dict(batch, input_ids=np.where(batch["input_mask"] > 0, batch["input_ids"], 7))
    apply = jax.jit(model.apply)
    a = apply({"params": params}, batch)
    b = apply({"params": params}, other)
    np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=1e-5)
    np.testing.assert_allclose(a["nsp_logits"], b["nsp_logits"], atol=1e-5)


def _expected_count(layers, h, heads, ff, vocab, positions=512, types=2):
    embeddings = (vocab + positions + types) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * ff + ff) + (ff * h + h) + 2 * h
    pooler = h * h + h
    mlm = h * h + h + 2 * h + vocab
    nsp = 2 * h + 2
    return embeddings + layers * layer + pooler + mlm + nsp


@pytest.mark.parametrize("preset", list(BERT_SIZES))
def test_parameter_counts_per_preset(preset):
    cfg = TransformerConfig(vocab_size=30522, **bert_preset(preset))
    batch = jax.tree.map(jnp.asarray, _batch(np.random.default_rng(0)))
    shapes = jax.eval_shape(lambda: bert.Model(cfg).init(jax.random.key(0), batch))["params"]
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.meta.unbox(shapes)))
    layers, h, heads = BERT_SIZES[preset]
    assert count == _expected_count(layers, h, heads, 4 * h, 30522)
    if preset == "base":
        assert count == 110_106_428  # Hugging Face BertForPreTraining(bert-base-uncased) has exactly this many
    if preset == "large":
        assert abs(count - 340e6) / 340e6 < 0.02  # the paper rounds 336.2M to "340M"


def test_every_parameter_has_logical_axis_names():
    cfg = TransformerConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
    batch = jax.tree.map(jnp.asarray, _batch(np.random.default_rng(0)))
    boxed = jax.eval_shape(lambda: bert.Model(cfg).init(jax.random.key(0), batch))["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    assert all(len(x.names) == len(x.value.shape) for x in leaves)


def test_bfloat16_compute_keeps_float32_params_and_close_outputs():
    kw = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=L)
    batch = _batch(np.random.default_rng(0))
    f32, bf16 = bert.Model(TransformerConfig(**kw)), bert.Model(TransformerConfig(dtype="bfloat16", **kw))
    params = jax.jit(f32.init)(jax.random.key(0), batch)["params"]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(jax.jit(bf16.init)(jax.random.key(0), batch)["params"]))
    a = jax.jit(f32.apply)({"params": params}, batch)["mlm_logits"]
    b = jax.jit(bf16.apply)({"params": params}, batch)["mlm_logits"]
    assert b.dtype == jnp.float32
    assert 0 < float(jnp.max(jnp.abs(a - b))) < 0.1


def test_bad_model_config_is_a_user_error():
    with pytest.raises(UserError, match="not divisible"):
        TransformerConfig(hidden_size=100, num_heads=3)
    with pytest.raises(UserError, match="at least one layer"):
        TransformerConfig(num_layers=0)
    with pytest.raises(UserError, match="unknown preset 'huge'"):
        bert_preset("huge")


@pytest.mark.parametrize("variant", [
    dict(),
    dict(packed=True),
    dict(share_layers="all", remat="full"),
    dict(causal=True, norm="pre"),
])
def test_last_layer_at_read_positions_equals_gathering_the_full_output(variant):
    """`outputs_at` runs the last layer's queries and feed-forward only at the read positions: the
    states there, the pooled vector and every parameter gradient must equal the full computation's."""
    from bertology.models.transformer import Encoder, gather_positions

    variant = dict(variant)
    packed, causal = variant.pop("packed", False), variant.pop("causal", False)
    cfg = TransformerConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                            max_position_embeddings=L, **variant)
    batch = _batch(np.random.default_rng(1))
    packing = np.where(batch["input_mask"] > 0, 1 + (np.arange(L)[None] >= 5), 0).astype(np.int32)
    encoder = Encoder(cfg, causal=causal)
    inputs = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
    args = ({**inputs, "packing_ids": packing} if packed else inputs,)
    params = jax.jit(encoder.init)(jax.random.key(0), *args)["params"]
    weights = jax.random.normal(jax.random.key(1), (B, P, cfg.hidden_size))

    def read(p, at):
        out = encoder.apply({"params": p}, *args, outputs_at=batch["masked_positions"] if at else None)
        seq = out["sequence"] if at else gather_positions(out["sequence"], batch["masked_positions"])
        return jnp.sum(seq * weights) + jnp.sum(out["pooled"] ** 2), (seq, out["pooled"])

    value_and_grad = jax.jit(jax.value_and_grad(read, has_aux=True), static_argnums=1)
    (_, (seq, pooled)), grads = value_and_grad(params, True)
    (_, (ref_seq, ref_pooled)), ref_grads = value_and_grad(params, False)
    np.testing.assert_allclose(seq, ref_seq, atol=1e-5)
    np.testing.assert_allclose(pooled, ref_pooled, atol=1e-5)
    for g, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):  # float32 rounding, relative to the scale
        np.testing.assert_allclose(g, ref, atol=1e-6 * np.abs(ref).max() + 1e-7)
    if packed or causal:  # the mask really differs from padding alone here
        other = Encoder(cfg).apply({"params": params}, inputs, outputs_at=batch["masked_positions"])["sequence"]
        assert np.abs(np.asarray(other) - np.asarray(seq)).max() > 1e-3


def test_vocab_bias_gradient_is_the_column_sum():
    from bertology.models.heads import add_vocab_bias

    logits = jax.random.normal(jax.random.key(0), (3, 5, 11))
    bias = jax.random.normal(jax.random.key(1), (11,))
    cotangent = np.random.default_rng(0).normal(size=(3, 5, 11)).astype(np.float32)
    out, vjp = jax.vjp(add_vocab_bias, logits, bias)
    np.testing.assert_array_equal(out, logits + bias)
    d_logits, d_bias = vjp(jnp.asarray(cotangent))
    np.testing.assert_array_equal(d_logits, cotangent)
    np.testing.assert_allclose(d_bias, cotangent.sum((0, 1)), rtol=1e-5, atol=1e-6)


def test_bfloat16_packed_rows_with_padding_stay_finite():
    """A padding slot of a packed row has no key to attend to; its mask must stay finite in bfloat16
    (float32's lowest value rounds to -inf there and made the whole row NaN)."""
    from bertology.models.transformer import Encoder

    cfg = TransformerConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                            max_position_embeddings=L, dtype="bfloat16", attention_dropout_rate=0.0)
    batch = _batch(np.random.default_rng(4))
    packing = np.where(batch["input_mask"] > 0, 1 + (np.arange(L)[None] >= 4), 0).astype(np.int32)
    encoder = Encoder(cfg)
    args = ({"input_ids": batch["input_ids"], "input_mask": batch["input_mask"], "segment_ids": batch["segment_ids"],
             "packing_ids": packing},)
    params = jax.jit(encoder.init)(jax.random.key(0), *args)["params"]
    out = jax.jit(encoder.apply)({"params": params}, *args)
    grads = jax.jit(jax.grad(lambda p: encoder.apply({"params": p}, *args)["sequence"].astype(jnp.float32).sum()))(params)
    assert np.isfinite(np.asarray(out["sequence"], np.float32)).all()
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
