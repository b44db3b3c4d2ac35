"""Transformer-XL and XLNet: relative attention against a direct float64 computation, memory
equivalence, the query stream's blindness to its own token, the objectives' carry, FLOP counts
against XLA's, and learning with carried memory.

The references are independent of the code under test: scores are built per (query, key) pair
from the distance a - j (no rel_shift), and the memory test compares two segments with one pass
over their concatenation.
"""

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertology import models
from bertology.errors import UserError
from bertology.models import relative
from bertology.models.relative import RelativeAttention, rel_shift
from bertology.models.transformer import TransformerConfig
from bertology.families.transfo_xl import objective as txl_objective
from bertology.families.xlnet import objective as xlnet_objective

V = 37
COMMON = dict(vocab_size=V, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24, positions="none",
              type_vocab_size=0, embedding_norm=False, dropout_rate=0.0, attention_dropout_rate=0.0, pooler=False)
TXL = dict(COMMON, family="transfo_xl", scale_embeddings=True, activation="relu")
XLNET = dict(COMMON, family="xlnet", activation="gelu_tanh")


def init(block, batch):
    model = models.build(block)
    return model, nn.meta.unbox(model.init(jax.random.key(0), batch)["params"])


def test_rel_shift_puts_each_distance_under_its_key():
    """Column j of row i after the shift holds the score at distance (klen - q + i) - j."""
    q, klen = 5, 9
    raw = np.random.default_rng(0).normal(size=(2, q, klen + q)).astype(np.float32)  # column c: distance klen - c
    shifted = np.asarray(rel_shift(jnp.asarray(raw), klen))
    for i in range(q):
        for j in range(klen):
            d = (klen - q + i) - j
            assert shifted[0, i, j] == raw[0, i, klen - d]


def sinusoid_np(d: np.ndarray, dim: int) -> np.ndarray:
    inv = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
    return np.concatenate([np.sin(d[..., None] * inv), np.cos(d[..., None] * inv)], -1)


@pytest.mark.parametrize("clamp_len,bi_data", [(-1, False), (3, True)])
def test_relative_attention_matches_direct_scores(clamp_len, bi_data):
    """The layer's output equals a float64 computation that scores every (query, key) pair from
    its own distance: content + position + segment terms, memory keys first, reversed rows with
    negated distances, clamping, masking, softmax, output projection, residual and LayerNorm."""
    cfg = TransformerConfig(**{k: v for k, v in XLNET.items() if k != "family"})
    B, q, m, d = 4, 5, 3, cfg.hidden_size
    rng = np.random.default_rng(1)
    h, memory = rng.normal(size=(B, q, d)), rng.normal(size=(B, m, d))
    allowed = rng.random((B, q, m + q)) < 0.7
    allowed[..., m:] |= np.eye(q, dtype=bool)
    seg = rng.integers(0, 2, (B, q))
    different = seg[:, :, None] != np.concatenate([np.zeros((B, m), int), seg], 1)[:, None, :]
    pos = relative.encodings(q, m + q, d, clamp_len, bi_data, B)
    layer = RelativeAttention(cfg, segment_term=True)
    args = (jnp.asarray(h, jnp.float32), jnp.asarray(memory, jnp.float32), pos, jnp.asarray(allowed), True, None,
            jnp.asarray(different))
    params = nn.meta.unbox(layer.init(jax.random.key(0), *args)["params"])
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(2), x.shape), params)  # biases too
    got, _ = layer.apply({"params": params}, *args)

    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    keys = np.concatenate([memory, h], 1)
    qh = np.einsum("bqe,end->bqnd", h, p["query"]["kernel"])
    kh = np.einsum("bke,end->bknd", keys, p["key"]["kernel"])
    vh = np.einsum("bke,end->bknd", keys, p["value"]["kernel"])
    bias = p["biases"]
    scores = np.zeros((B, cfg.num_heads, q, m + q))
    for b in range(B):
        sign = -1 if bi_data and b >= B // 2 else 1
        for i in range(q):
            for j in range(m + q):
                dist = sign * (m + i - j)
                dist = np.clip(dist, -clamp_len, clamp_len) if clamp_len > 0 else dist
                r = np.einsum("e,end->nd", sinusoid_np(np.array(float(dist)), d), p["position"]["kernel"])
                s = (np.sum((qh[b, i] + bias["r_w_bias"]) * kh[b, j], -1)
                     + np.sum((qh[b, i] + bias["r_r_bias"]) * r, -1)
                     + np.sum((qh[b, i] + bias["r_s_bias"]) * p["segment"][int(different[b, i, j])], -1))
                scores[b, :, i, j] = s / np.sqrt(cfg.head_dim)
    scores = np.where(allowed[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    x = h + np.einsum("bnqk,bknd,end->bqe", probs, vh, p["output"])
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + cfg.layer_norm_eps)
    want = x * p["norm"]["scale"] + p["norm"]["bias"]
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def test_transfo_xl_two_segments_with_memory_equal_one_pass(untie_r=False):
    """With mem_len >= the first segment, the second segment's logits with memory are those of
    one pass over both segments: the memory is exactly the context the segment would have seen.
    (Shared relative biases here; the HF parity tests carry memory with untied ones.)"""
    L = 6
    block = dict(TXL, mem_len=L, untie_r=untie_r)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 2 * L)), jnp.int32)
    whole = dict(TXL, mem_len=2 * L, untie_r=untie_r)
    model, params = init(block, {"input_ids": ids[:, :L]})
    first = model.apply({"params": params}, {"input_ids": ids[:, :L]})
    second = model.apply({"params": params}, {"input_ids": ids[:, L:], "carry": first["carry"]})
    one = models.build(whole).apply({"params": params}, {"input_ids": ids})
    np.testing.assert_allclose(np.asarray(second["logits"]), np.asarray(one["logits"][:, L:]), atol=1e-5)
    np.testing.assert_allclose(np.asarray(first["logits"]), np.asarray(one["logits"][:, :L]), atol=1e-5)
    # a shorter memory loses context: the second segment's first positions then differ
    short = models.build(dict(block, mem_len=2))
    carry = models.family("transfo_xl").initial_carry(dict(block, mem_len=2), 2)
    first = short.apply({"params": params}, {"input_ids": ids[:, :L], "carry": carry})
    second = short.apply({"params": params}, {"input_ids": ids[:, L:], "carry": first["carry"]})
    assert np.abs(np.asarray(second["logits"][:, 0]) - np.asarray(one["logits"][:, L])).max() > 5e-5  # 50x the tolerance


def test_transfo_xl_same_length_sees_mem_len_keys():
    """same_length: each query sees itself and the mem_len - 1 keys before it (the reference's eval mask)."""
    keys = jnp.ones((1, 3 + 4), bool)
    allowed = np.asarray(relative.causal_mask(keys, 4, 3, same_length=True))[0]
    assert allowed.sum(1).tolist() == [3, 3, 3, 3]
    for i in range(4):
        assert np.flatnonzero(allowed[i]).tolist() == [i + 1, i + 2, i + 3]


def xlnet_batch(rng, B=2, L=8, P=3):
    """Targets from a factorisation order: target t sees non-targets and targets earlier in the order."""
    ids = rng.integers(0, V, (B, L)).astype(np.int32)
    perm = np.zeros((B, L, L), np.float32)
    mapping = np.zeros((B, P, L), np.float32)
    targets = np.stack([np.sort(rng.choice(L, P, replace=False)) for _ in range(B)])
    for b in range(B):
        order = np.full(L, -1)
        order[targets[b]] = rng.permutation(P)
        perm[b] = (order[:, None] <= order[None, :]) & (order[None, :] >= 0)
        mapping[b, np.arange(P), targets[b]] = 1
    segments = np.repeat((np.arange(L) >= L // 2)[None].astype(np.int32), B, 0)
    batch = dict(input_ids=ids, input_mask=np.ones((B, L), np.int32), segment_ids=segments, perm_mask=perm,
                 target_mapping=mapping, targets=np.take_along_axis(ids, targets, 1),
                 target_weights=np.ones((B, P), np.float32))
    return batch, targets


def test_xlnet_query_stream_does_not_see_its_own_token():
    """Changing a target's token leaves its own prediction unchanged (the query stream never
    reads it, through any layer or the memory), while changing a token it may see moves it."""
    rng = np.random.default_rng(3)
    block = dict(XLNET, mem_len=4, reuse_len=4)
    batch, targets = xlnet_batch(rng)
    model, params = init(block, batch)
    warm = model.apply({"params": params}, xlnet_batch(rng)[0])["carry"]  # a non-empty memory
    base = np.asarray(model.apply({"params": params}, {**batch, "carry": warm})["logits"])
    for b in range(2):
        for p, t in enumerate(targets[b]):
            ids = batch["input_ids"].copy()
            ids[b, t] = (ids[b, t] + 1) % V
            out = np.asarray(model.apply({"params": params}, {**batch, "input_ids": ids, "carry": warm})["logits"])
            np.testing.assert_allclose(out[b, p], base[b, p], atol=1e-6)
            seen = [j for j in range(8) if batch["perm_mask"][b, t, j] == 0]
            ids = batch["input_ids"].copy()
            ids[b, seen[0]] = (ids[b, seen[0]] + 1) % V
            out = np.asarray(model.apply({"params": params}, {**batch, "input_ids": ids, "carry": warm})["logits"])
            assert np.abs(out[b, p] - base[b, p]).max() > 1e-4


def test_xlnet_memory_caches_the_first_reuse_len_inputs():
    """The carry after a step holds, per layer, the layer's content input at the first reuse_len
    positions (the embeddings for layer 0) after the old memory's last mem_len - reuse_len slots."""
    rng = np.random.default_rng(4)
    block = dict(XLNET, mem_len=5, reuse_len=3)
    batch, _ = xlnet_batch(rng)
    model, params = init(block, batch)
    first = model.apply({"params": params}, batch)["carry"]
    second = model.apply({"params": params}, {**batch, "carry": first})["carry"]
    embedded = np.asarray(params["embeddings"]["token"]["embedding"])[batch["input_ids"][:, :3]]
    np.testing.assert_allclose(np.asarray(first["memory"][:, 0, 2:]), embedded, atol=1e-6)
    assert np.asarray(first["memory_mask"]).tolist() == [[0, 0, 1, 1, 1]] * 2
    np.testing.assert_array_equal(np.asarray(second["memory"][:, :, :2]), np.asarray(first["memory"][:, :, 3:]))
    assert np.asarray(second["memory_mask"]).tolist() == [[1] * 5] * 2


@pytest.mark.parametrize("objective,block", [(txl_objective, dict(TXL, mem_len=4)),
                                             (xlnet_objective, dict(XLNET, mem_len=4, reuse_len=4))])
def test_objective_loss_and_carry(objective, block):
    """The loss is the cross-entropy at the weighted targets; the returned carry is the model's
    next memory, with no gradient flowing into it."""
    rng = np.random.default_rng(5)
    if block["family"] == "xlnet":
        batch, _ = xlnet_batch(rng)
    else:
        ids = rng.integers(0, V, (2, 8)).astype(np.int32)
        batch = dict(input_ids=ids, input_mask=np.ones_like(ids), targets=np.roll(ids, -1, 1),
                     target_weights=np.r_[np.ones(7), 0][None].repeat(2, 0).astype(np.float32))
    model, params = init(block, batch)
    batch["carry"] = models.family(block["family"]).initial_carry(block, 2)
    terms = objective.loss(params, batch, None, model)
    out = model.apply({"params": params}, batch)
    logp = jax.nn.log_softmax(out["logits"])
    nll = -np.take_along_axis(np.asarray(logp), batch["targets"][..., None], -1)[..., 0]
    want = (nll * batch["target_weights"]).sum() / (batch["target_weights"].sum() + 1e-5)
    assert float(terms.loss_value()) == pytest.approx(float(want), rel=1e-5)
    jax.tree.map(np.testing.assert_array_equal, terms.carry, out["carry"])
    grads = jax.grad(lambda p: jnp.sum(objective.loss(p, batch, None, model).carry["memory"]))(params)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))


def test_transfo_xl_learns_with_carried_memory():
    """A stream whose next token is the one 5 back: with memory longer than the segment (4), the
    first tokens of each segment are predictable only from the memory; loss falls well below
    uniform when the carry goes from step to step."""
    L, steps = 4, 120
    block = dict(TXL, mem_len=8)
    pattern = np.random.default_rng(6).integers(0, V, 5)
    stream = np.tile(pattern, (L * (steps + 1)) // 5 + 2)[None].repeat(4, 0)
    stream = np.stack([np.roll(s, -k) for k, s in enumerate(stream)]).astype(np.int32)
    model, params = init(block, {"input_ids": stream[:, :L]})
    tx = optax.adam(3e-3)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, batch):
        (value, terms), grads = jax.value_and_grad(
            lambda p: (lambda t: (t.loss_value(), t))(txl_objective.loss(p, batch, None, model)), has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value, terms.carry

    carry = models.family("transfo_xl").initial_carry(block, 4)
    losses = []
    for t in range(steps):
        ids = stream[:, t * L:(t + 1) * L]
        batch = dict(input_ids=ids, input_mask=np.ones_like(ids), targets=stream[:, t * L + 1:(t + 1) * L + 1],
                     target_weights=np.ones(ids.shape, np.float32), carry=carry)
        params, opt, value, carry = step(params, opt, batch)
        losses.append(float(value))
    print(f"\nloss first 10 steps {np.mean(losses[:10]):.3f}, last 10 {np.mean(losses[-10:]):.3f}, uniform {np.log(V):.3f}")
    assert np.mean(losses[-10:]) < 0.2 * np.log(V)


def xla_forward_flops(model, params, batch) -> float:
    compiled = jax.jit(lambda p, b: model.apply({"params": p}, b)["logits"]).lower(params, batch).compile()
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


@pytest.mark.parametrize("family", ["transfo_xl", "xlnet"])
def test_flops_match_xla_count(family):
    """The forward FLOPs the counter gives (training FLOPs / 3) are within 10% of XLA's count of
    the compiled forward (which also counts softmax, norms and elementwise work, and drops what
    nothing reads: XLNet's last content layer beyond its keys and values)."""
    import ml_collections

    L, M, P, B = 32, 24, 6, 2
    sizes = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, vocab_size=512)
    if family == "transfo_xl":
        block = dict(TXL, **sizes, mem_len=M)
        batch = {"input_ids": jnp.zeros((B, L), jnp.int32)}
    else:
        block = dict(XLNET, **sizes, mem_len=M, reuse_len=16)
        rng = np.random.default_rng(0)
        batch = {k: v for k, v in xlnet_batch(rng, B, L, P)[0].items() if k not in ("targets", "target_weights")}
    model, params = init(block, batch)
    batch["carry"] = models.family(family).initial_carry(block, B)
    config = ml_collections.ConfigDict(dict(model=block, data=dict(max_seq_length=L, num_predict=P)))
    counted = models.flops_per_token(config) / 3 * B * L
    measured = xla_forward_flops(model, params, batch)
    print(f"\n{family}: counted {counted:.3e}, XLA {measured:.3e}, ratio {counted / measured:.3f}")
    assert counted == pytest.approx(measured, rel=0.10)


def test_configs_build_and_refuse():
    """Every preset builds its model config; settings the families do not compute are refused."""
    for name, presets in (("transfo_xl", ("tiny", "base")), ("xlnet", ("tiny", "base", "large"))):
        for preset in presets:
            c = helpers.config(name, preset)
            block = dict(c.model, vocab_size=c.model.vocab_size or 8192)
            cfg = models.encoder_config(block)
            assert cfg.num_layers >= 2 and block["mem_len"] > 0
        with pytest.raises(UserError):
            helpers.config(name, "huge")
    base = dict(helpers.config("transfo_xl", "base").model, vocab_size=8192)
    assert (base["num_layers"], base["hidden_size"], base["num_heads"], base["intermediate_size"], base["mem_len"]) == (
        16, 410, 10, 2100, 150)
    with pytest.raises(UserError, match="positions"):
        models.build(dict(TXL, positions="absolute"))
    with pytest.raises(UserError, match="same_length"):
        models.build(dict(TXL, same_length=True, mem_len=0))
