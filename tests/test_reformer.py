"""Reformer (Kitaev et al. 2020, arXiv 2001.04451), end to end: random Hugging Face
`ReformerModelWithLMHead` (causal) and `ReformerForMaskedLM` (bidirectional, padded rows, a
length HF pads inside) models mixing LSH and local layers, imported and compared with
transformers hashing with the same rotations, exported back and reloaded; controls that a wrong
number of hashing rounds or chunk window is seen; LSH attention against a dense shared-QK
softmax with the self-mask; the reversible stack's gradients against plain autodiff and its
memory against depth; the tiny config learning on the embedded corpus; the FLOP count by hand;
the presets against HF's released shapes."""

import dataclasses
import functools
import os

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from bertology import models, validation
from bertology.errors import UserError
from bertology.families.reformer import model as reformer
from bertology.interop import export_hf, hf_config, import_hf, names, records
from bertology.models import flops, layout, lsh, reversible
from bertology.train.checkpoint import load_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V = 61
TOLERANCE = 1e-4  # float32 parity, as tests/test_interop.py
SEED = 7  # HF's hash_seed: the rotations' torch seed
# 3 layers (LSH, local, LSH), 2 heads of 8, 2 hashing rounds; LSH chunks of 4 and local chunks of 8 over
# rows of 32: 16 sorted LSH chunks a layer; the lcm of the chunks (8) is what HF pads rows to
SMALL = dict(vocab_size=V, hidden_size=16, num_attention_heads=2, attention_head_size=8, feed_forward_size=24,
             attn_layers=["lsh", "local", "lsh"], num_hashes=2, lsh_attn_chunk_length=4, local_attn_chunk_length=8,
             axial_pos_shape=[4, 8], axial_pos_embds_dim=[6, 10], max_position_embeddings=32, hash_seed=SEED,
             hidden_act="gelu", pad_token_id=0)  # every kind's; KINDS adds or overrides
# causal: 4 buckets, each chunk seeing the one before, axial positions, the erf GELU; bidirectional: 2 x 4
# factorised buckets, one chunk before and one after, a learned position table, ReLU, the feed-forward block
# run 8 tokens at a time, rows of 30 tokens (HF pads them to 32 inside); padding in both batches
KINDS = {
    "causal": (transformers.ReformerModelWithLMHead, dict(is_decoder=True, num_buckets=4), 32, (32, 27)),
    "bidirectional": (transformers.ReformerForMaskedLM,
                      dict(is_decoder=False, num_buckets=[2, 4], lsh_num_chunks_after=1, local_num_chunks_after=1,
                           axial_pos_embds=False, hidden_act="relu", chunk_size_feed_forward=8), 30, (30, 19)),
}


def rotations(num_hashes=2, num_buckets=4):
    """HF's draw (`LSHSelfAttention._hash_vectors` with hash_seed set): the same for every LSH layer."""
    torch.manual_seed(SEED)
    return torch.randn((2, 8, num_hashes, lsh.rotation_size(num_buckets) // 2)).numpy()


def make_batch(length, lengths, seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, V, (len(lengths), length)), 0).astype(np.int32)
    return dict(input_ids=ids, input_mask=mask, masked_positions=np.broadcast_to(np.arange(length, dtype=np.int32),
                                                                                 ids.shape))


def hf_outputs(model, batch):
    """The logits and every hidden state HF gives (the x2 stream before each layer and after the
    last, at HF's padded length: cut to the row's)."""
    length = batch["input_ids"].shape[1]
    with torch.no_grad():
        o = model(input_ids=torch.tensor(batch["input_ids"]).long(), attention_mask=torch.tensor(batch["input_mask"]).long(),
                  output_hidden_states=True)
        logits = o.logits
        if model.lm_head.decoder.bias is None:
            # transformers 5.23 dropped 4's `decoder.bias = bias` tie and never adds `lm_head.bias`,
            # which the checkpoint holds and 4 and 5.24 (the model we reproduce) add: add it here
            logits = logits + model.lm_head.bias
    return {"logits": logits.numpy(), **{f"hidden_{i}": h[:, :length].numpy() for i, h in enumerate(o.hidden_states)}}


@functools.partial(jax.jit, static_argnums=(0,))
def our_outputs(cfg, params, batch, rotations):
    """The model's logits and the trunk's hidden states, in one jitted call."""
    out, state = reformer.Model(cfg).apply({"params": params}, batch, rotations=rotations,
                                              capture_intermediates=lambda m, _: isinstance(m, reformer.Reformer))
    layers = state["intermediates"]["reformer"]["__call__"][0]["layers"]
    return {"logits": next(iter(out.values())), **{f"hidden_{i}": h for i, h in enumerate(layers)}}


@pytest.fixture(scope="module", params=sorted(KINDS))
def imported(request, tmp_path_factory):
    """(kind, HF model, its outputs on the kind's batch, that batch, our params, our block, the run
    directory) of one random HF model of each kind, imported: every tensor, LayerNorms and axial
    tables too, drawn from N(0, 0.2) so that a swapped, missed or misplaced tensor shows."""
    cls, settings_, length, lengths = KINDS[request.param]
    hf = cls(transformers.ReformerConfig(**{**SMALL, **settings_}))
    torch.manual_seed(0)  # after construction, whose own init draws differ across transformers versions
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.eval()
    root = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(root / "hf")
    report = import_hf(root / "hf", root / "run")
    assert (report.family, report.model_type, report.fresh, report.unused) == ("reformer", "reformer", [], [])
    params, run_config = load_params(root / "run")
    batch = make_batch(length, lengths)
    return request.param, hf, hf_outputs(hf, batch), batch, params, run_config["model"], root


def test_import_matches_transformers(imported):
    kind, hf, reference, batch, params, block, _ = imported
    cfg = models.encoder_config(block)
    s = cfg.reformer
    assert (s.is_decoder, s.attn_layers, s.num_hashes, s.axial_pos_embds, cfg.activation) == (
        (True, ("lsh", "local", "lsh"), 2, True, "gelu") if kind == "causal" else
        (False, ("lsh", "local", "lsh"), 2, False, "relu"))
    flat = set(flatten_dict(params))
    assert {r.ours for r in names.tensors(records.registry()["reformer"].layout, flat)} == flat
    assert not any(k[-1] == "bias" for k in flat if k[1].startswith("attention_") and k[2] != "norm"), "no biases"
    assert s.padded_length(batch["input_ids"].shape[1]) == 32
    r = rotations(num_buckets=s.num_buckets)
    # the causal LM gives `logits` at every position, the masked LM `mlm_logits` at the masked ones
    shapes = jax.eval_shape(lambda: reformer.Model(cfg).apply({"params": params}, batch, rotations=r))
    name = "logits" if kind == "causal" else "mlm_logits"
    assert {k: v.shape for k, v in shapes.items()} == {name: (*batch["input_ids"].shape, V)}
    diffs = helpers.max_diff(our_outputs(cfg, params, batch, r), reference, batch["input_mask"])
    print(f"\nreformer {kind} max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs; logits "
          f"{diffs['logits']:.2e}, scale {np.abs(reference['logits']).max():.1f})")
    assert len(diffs) == 1 + len(SMALL["attn_layers"]) + 1
    assert max(diffs.values()) <= TOLERANCE, diffs
    if kind != "causal":
        return
    # The test tells the settings apart: one hashing round instead of two (the first of the same
    # rotations), or LSH chunks that see no chunk before them, are far off.
    for name, wrong_s, wrong_r in (("one hashing round", s, r[:, :, :1]),
                                   ("no chunk before", dataclasses.replace(s, lsh_num_chunks_before=0), r)):
        wrong = helpers.max_diff(our_outputs(dataclasses.replace(cfg, reformer=wrong_s), params, batch, wrong_r),
                                 reference, batch["input_mask"])
        print(f"the same tensors, {name}: logits {wrong['logits']:.2e}")
        assert wrong["logits"] > 1e-2, (name, wrong)


def test_export_reloads_in_transformers(imported):
    kind, hf, reference, batch, _, block, root = imported
    exported = export_hf(root / "run", root / "export")
    reloaded, info = type(hf).from_pretrained(exported[0], output_loading_info=True)
    # export writes the head's bias under both names; transformers 5.23's head reads only lm_head.bias
    unexpected = set(info["unexpected_keys"]) - ({"lm_head.decoder.bias"} if hf.lm_head.decoder.bias is None else set())
    assert not info["missing_keys"] and not unexpected and not info["mismatched_keys"], info
    keys = set(SMALL) - {"pad_token_id"} | set(KINDS[kind][1])
    assert {k: getattr(reloaded.config, k) for k in keys} == {k: getattr(hf.config, k) for k in keys}
    assert reloaded.config.architectures == [type(hf).__name__]
    round_trip = helpers.max_diff(hf_outputs(reloaded.eval(), batch), reference)
    print(f"\nreformer {kind} round trip max abs diff: {max(round_trip.values()):.2e}")
    assert max(round_trip.values()) <= 1e-6, round_trip


# --- LSH attention -----------------------------------------------------------------------------------------

def dense_shared_qk(qk, v, keys, causal):
    """Full shared-QK attention (section 2) in float64: keys are the queries at unit RMS over sqrt(d)
    (HF's `_len_and_dim_norm`), padding and (causal) later keys get -1e9, a query's own key -1e5, so a
    token attends to itself only when nothing else is allowed."""
    qk, v = np.asarray(qk, np.float64), np.asarray(v, np.float64)
    d = qk.shape[-1]
    k = qk / np.sqrt((qk ** 2).mean(-1, keepdims=True) + 1e-6) / np.sqrt(d)
    s = np.einsum("bqhd,bkhd->bhqk", qk, k)
    length = qk.shape[1]
    allowed = np.broadcast_to(np.asarray(keys)[:, None, None, :], s.shape)
    if causal:
        allowed = allowed & np.tril(np.ones((length, length), bool))
    s = np.where(allowed, s, -1e9)
    s = np.where(np.eye(length, dtype=bool), -1e5, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("causal", [True, False])
def test_lsh_with_one_bucket_is_full_shared_qk_attention(causal):
    """One hashing round into one bucket, chunks of 8 over 24 tokens each seeing the 2 chunks
    before it (every key once, circularly): LSH attention is the full softmax with the self-mask,
    padding included. With 4 buckets the tokens are sorted apart and back, and the same full window
    still gives the full softmax; a window of one chunk before does not."""
    b, length, heads, d = 2, 24, 2, 4
    rng = np.random.default_rng(0)
    qk, v = (rng.normal(size=(b, length, heads, d)).astype(np.float32) for _ in range(2))
    keys = np.arange(length)[None] < np.array([[24], [17]])
    want = dense_shared_qk(qk, v, keys, causal)
    rotations = rng.normal(size=(heads, d, 1, 2)).astype(np.float32)  # 4 buckets: 2 columns

    @jax.jit
    def run(qk, v, keys, rotations):  # every variant in one program: one compile
        out = {}
        for name, num_buckets, before in (("one bucket", 1, 2), ("four buckets", 4, 2), ("narrow", 4, 1)):
            r = rotations[..., :lsh.rotation_size(num_buckets) // 2]
            out[name] = lsh.lsh_attend(qk, v, rotations=r, num_buckets=num_buckets, chunk=8, before=before, after=0,
                                       keys=keys, causal=causal)
        return out

    out = {name: tuple(map(np.asarray, o)) for name, o in run(qk, v, keys, rotations).items()}
    real = np.broadcast_to(np.asarray(keys)[:, None, None, :], out["one bucket"][1].shape)
    assert (out["one bucket"][1][real] == 0).all() and (out["one bucket"][1][~real] == 1).all()  # padding: its own
    np.testing.assert_allclose(out["one bucket"][0], want, atol=1e-5)
    assert len(np.unique(out["four buckets"][1])) == 5  # 4 buckets and the padding's
    np.testing.assert_allclose(out["four buckets"][0], want, atol=1e-5)
    assert np.abs(out["narrow"][0] - want).max() > 1e-2


# --- the reversible stack -----------------------------------------------------------------------------

def test_reversible_gradients_equal_autodiff(monkeypatch):
    """The Reformer's training gradients through the reversible stack (inputs recomputed in the
    backward pass, LSH buckets reused, the LSH probabilities' dropout replayed, fresh rotations
    drawn) equal plain autodiff of the same network on the same rng; a chunked feed-forward block
    and both attention kinds included. (Dropout at one site: each costs XLA:CPU a threefry to
    compile, and one shows the replay.)"""
    c = helpers.config("reformer", "tiny")
    c.model.update(vocab_size=V, hidden_size=16, num_heads=2, intermediate_size=32, max_position_embeddings=32,
                   axial_pos_shape=[4, 8], axial_pos_embds_dim=[8, 8], lsh_attn_chunk_length=8,
                   local_attn_chunk_length=8, num_buckets=4, chunk_size_feed_forward=8, dropout_rate=0.0,
                   attention_dropout_rate=0.0, lsh_attention_dropout_rate=0.1)
    cfg = models.encoder_config(c.model)
    batch = make_batch(32, (32, 27))
    targets = np.roll(batch["input_ids"], -1, axis=1)

    shapes = jax.eval_shape(lambda: nn.meta.unbox(reformer.Model(cfg).init(jax.random.key(0), batch)["params"]))
    stack = reversible.stack
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0.0, 0.2, x.shape).astype(np.float32), shapes)

    def loss(reversible_):
        model = reformer.Model(cfg, reversible=reversible_)

        def value(p):
            logits = model.apply({"params": p}, batch, deterministic=False, rngs={"dropout": jax.random.key(1)})["logits"]
            nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
            return jnp.mean(nll * batch["input_mask"])
        return jax.value_and_grad(value)

    calls = []  # which runs go through the custom gradient
    monkeypatch.setattr(reversible, "stack", lambda *a: calls.append(len(a[0])) or stack(*a))
    both = jax.jit(lambda p: (loss(True)(p), loss(False)(p)))  # one compile
    (value, got), (expected_value, expected) = jax.device_get(both(params))
    assert calls == [2]  # the reversible model's two layers, and only its
    assert value == pytest.approx(float(expected_value), rel=1e-6)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)))
    scale = max(float(np.abs(b).max()) for b in jax.tree.leaves(expected))
    print(f"\nreversible vs autodiff gradients: max abs diff {diff:.2e} (largest gradient {scale:.2e})")
    assert diff <= 1e-5 * max(1.0, scale), diff
    assert scale > 1e-3


def test_reversible_memory_is_flat_in_depth():
    """XLA's temporaries for the gradient of a 2- and an 8-layer stack: plain autodiff keeps every
    layer's activations (growing with depth), the reversible stack one layer's."""
    width, tokens = 64, 2048

    def f(p, x, context, hints):
        return jnp.tanh(x @ p) * context, None

    def g(p, y, context, hints):
        return jax.nn.relu(y @ p[0]) @ p[1], None

    def temporaries(depth, run):
        layers = ((f, g),) * depth
        params = tuple((jax.ShapeDtypeStruct((width, width), jnp.float32),
                        (jax.ShapeDtypeStruct((width, 4 * width), jnp.float32),
                         jax.ShapeDtypeStruct((4 * width, width), jnp.float32))) for _ in range(depth))
        contexts = (np.float32(1.0),) * depth

        def loss(params, x):
            y1, y2 = run(layers, params, x, x, contexts)[:2]
            return jnp.sum(y1 * y2)

        x = jax.ShapeDtypeStruct((tokens, width), jnp.float32)
        return jax.jit(jax.grad(loss)).lower(params, x).compile().memory_analysis().temp_size_in_bytes

    plain = [temporaries(n, reversible.forward) for n in (2, 8)]
    rev = [temporaries(n, reversible.stack) for n in (2, 8)]
    print(f"\ntemporaries, 2 -> 8 layers: autodiff {plain[0] / 2**20:.1f} -> {plain[1] / 2**20:.1f} MiB, "
          f"reversible {rev[0] / 2**20:.1f} -> {rev[1] / 2**20:.1f} MiB")
    layer = tokens * 4 * width * 4  # one layer's [tokens, 4·width] float32 activation
    assert plain[1] - plain[0] > 6 * layer  # autodiff keeps each layer's
    assert rev[1] - rev[0] < (plain[1] - plain[0]) / 10
    assert rev[1] < plain[1] / 3


def test_reversible_stack_gradients_on_cheap_blocks():
    """`reversible.stack`'s hand-written backward pass on three small blocks is autodiff's, hints
    included: f picks one column per row by an argmax of its input on the forward pass (as LSH
    picks buckets) and the backward pass reuses the pick."""
    def f(p, x, context, hints):
        h = x @ p
        pick = jnp.argmax(h, axis=-1) if hints is None else hints
        return jnp.tanh(h) * jax.nn.one_hot(pick, h.shape[-1]) * context + jnp.tanh(h), pick

    def g(p, y, context, hints):
        return jnp.sin(y @ p), None

    layers = ((f, g),) * 3
    rng = np.random.default_rng(0)
    params = tuple(tuple(rng.normal(0.0, 0.5, (8, 8)).astype(np.float32) for _ in range(2)) for _ in range(3))
    x = rng.normal(size=(5, 8)).astype(np.float32)
    contexts = (np.float32(0.5),) * 3

    def loss(run):
        def value(params, x1, x2):
            y1, y2 = run(layers, params, x1, x2, contexts)[:2]
            return jnp.sum(jnp.cos(y1) * y2)
        return jax.jit(jax.grad(value, argnums=(0, 1, 2)))

    got, want = loss(reversible.stack)(params, x, 2 * x), loss(reversible.forward)(params, x, 2 * x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)


# --- the tiny config learns ---------------------------------------------------------------------------------

def test_tiny_learns(tmp_path):
    """16 steps of the tiny preset (a local then an LSH layer, 2 hashing rounds, dropout on) as a
    causal LM on the embedded corpus, rows of 64 tokens in chunks of 16 (packed documents: each
    attends within its own): the loss falls."""
    from bertology.train.loop import train

    c = helpers.short_run_config("reformer", "tiny", total_steps=16, log_every=1, **{
        "data.max_seq_length": 64, "batch_size": 8, "optimizer.warmup_steps": 3, "optimizer.learning_rate": 3e-3,
        "model.max_position_embeddings": 64, "model.axial_pos_shape": [4, 16], "model.lsh_attn_chunk_length": 16,
        "model.local_attn_chunk_length": 16})
    assert (c.objective, c.data.objective, c.model.is_decoder, c.model.attn_layers) == (
        "causal_lm", "causal", True, ["local", "lsh"])
    lm = np.array([h["lm_loss"] for h in train(c, tmp_path / "run")["history"]])
    print(f"\nreformer tiny lm loss: first {lm[0]:.3f}, last 4 {lm[-4:].mean():.3f}")
    assert len(lm) == 16
    assert lm[0] > np.log(8192) - 0.5  # near uniform over the 8k vocabulary at the start
    assert lm[-4:].mean() < lm[0] - 0.75, lm  # nats: far beyond step-to-step noise


# --- FLOPs ------------------------------------------------------------------------------------------------------

def test_flops_per_token_is_the_hand_count():
    """The tiny preset by hand: per LSH layer the shared query-key and value projections, the
    output, the hashing (2 rounds of 8 buckets: 4 rotation columns) and 2 rounds of scores and
    context over a chunk and the one before (64 keys); per local layer query, key, value, output
    and the same 64 keys once; the feed-forward blocks; the 2H-wide head at every position. At
    64K tokens (enwik8) attention costs a sliver of full attention's."""
    c = helpers.config("reformer", "tiny")
    c.model.vocab_size = vcb = 8192
    h, i, length, window = 64, 128, 128, 64
    proj_lsh, proj_local = 2 * 2 * h * h + 2 * h * h, 3 * 2 * h * h + 2 * h * h
    attention = 2 * (2 * 2 * window * h + 2 * h * 8 // 2) + 2 * 2 * window * h
    ffn = 2 * (2 * 2 * h * i)
    assert models.flops_per_token(c) == pytest.approx(
        3 * (proj_lsh + proj_local + attention + ffn + 2 * 2 * h * vcb), rel=1e-12)
    cfg = models.encoder_config(c.model)
    assert models.flops_per_token(c, nominal=True) == pytest.approx(
        3 * (flops.stack(cfg, length, nominal=True) + 2 * 2 * h * vcb), rel=1e-12)
    big = helpers.config("reformer", "enwik8")
    big.model.vocab_size = 256
    cfg, s = models.encoder_config(big.model), reformer.settings(big.model, models.encoder_config(big.model))
    full = cfg.num_layers * 2 * 2 * 65536 * cfg.hidden_size
    assert reformer.attention_flops(cfg, s, 65536) < full / 20
    assert models.flops_per_token(big) < models.flops_per_token(big, nominal=True) / 5


# --- config, presets, layer places ----------------------------------------------------------------------------

def test_the_family_refuses_other_settings():
    base = dict(family="reformer", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                axial_pos_shape=[4, 8], axial_pos_embds_dim=[8, 8])
    cfg = models.encoder_config(base)
    assert (cfg.norm, cfg.type_vocab_size, cfg.embedding_norm, cfg.pooler) == ("pre", 0, False, False)
    assert reformer.settings(base, cfg).attn_layers == ("local", "lsh")  # HF's default pattern
    for key, value, match in (("norm", "post", "Reformer has norm='pre'"),
                              ("attn_layers", ["lsh"], "must name 2 layers"),
                              ("num_buckets", 5, "an even number of buckets"),
                              ("axial_pos_embds_dim", [8, 9], "sum to hidden_size=16"),
                              ("activation", "geglu", "takes one of"),
                              ("lsh_num_chunks_after", 1, None)):
        block = {**base, key: value, **({"is_decoder": True} if match is None else {})}
        with pytest.raises(UserError, match=match or "is_decoder=True"):
            models.build(block)
    # the default rule places the layers: embeddings below, attention_i / ffn_i in layer i, the norm above
    assert [layout.stack_layer_index(p) for p in (("embeddings", "axial_0"), ("attention_1", "query_key", "kernel"),
                                                  ("ffn_0", "output", "bias"), ("final_norm", "scale"))] == [
        layout.EMBEDDINGS, 1, 0, None]


@pytest.mark.parametrize("preset", ["tiny", "tiny_mlm", "crime_and_punishment", "enwik8"])
def test_presets_pass_validation(preset):
    c = helpers.config("reformer", preset)
    c.model.vocab_size = c.model.vocab_size or 8192
    validation.check(c)


@pytest.mark.parametrize("preset", ["crime_and_punishment", "enwik8"])
def test_released_shapes_are_hf_shapes(preset):
    """The presets build HF's network tensor for tensor (HF's built on torch's meta device from the
    config we export), and crime_and_punishment exports the released config.json's settings."""
    c = helpers.config("reformer", preset)
    c.model.vocab_size = c.model.vocab_size or 258
    block = c.model.to_dict()
    batch = {"input_ids": np.zeros((1, 4), np.int32), "input_mask": np.ones((1, 4), np.int32)}
    params = jax.eval_shape(lambda: nn.meta.unbox(models.build(block).init(jax.random.key(0), batch)))["params"]
    ours = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    record = records.for_run(block)
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    with torch.device("meta"):
        hf = transformers.ReformerModelWithLMHead(transformers.ReformerConfig(**exported))
    # transformers 5.24's head has a bias of its own beside the unused `lm_head.bias` (4.x: one, tied)
    decoder_bias = hf.lm_head.decoder.bias
    unused = hf.lm_head.bias.numel() if decoder_bias is not None and decoder_bias is not hf.lm_head.bias else 0
    assert ours == sum(p.numel() for p in hf.parameters()) - unused
    print(f"\nreformer {preset}: {ours / 1e6:.1f}M parameters")
    if preset == "crime_and_punishment":  # google/reformer-crime-and-punishment's config.json
        released = dict(attn_layers=["local", "lsh"] * 3, attention_head_size=64, axial_pos_embds_dim=[64, 192],
                        axial_pos_shape=[512, 1024], feed_forward_size=512, hidden_act="relu", hidden_size=256,
                        is_decoder=True, local_attn_chunk_length=64, lsh_attn_chunk_length=64,
                        max_position_embeddings=524288, num_attention_heads=2, num_buckets=[64, 128], num_hashes=1,
                        num_hidden_layers=6, vocab_size=320, hidden_dropout_prob=0.05)
        assert {k: exported[k] for k in released} == released


# --- fine-tuning ------------------------------------------------------------------------------------------------

def test_the_fine_tuning_trunk_is_the_pretrained_one_read_at_the_first_token(tmp_path):
    """The long-range preset's classification job (shrunk to rows of 64 tokens): its trunk's
    parameters are a pretraining model's `reformer` parameters, nothing more; the logits are the
    head over that pretraining trunk's first-token state; and fine-tuning's gradients through the
    reversible stack (dropout on) equal plain autodiff's."""
    from bertology import sweep, tasks
    from bertology.train import finetune

    c = sweep.load_config(helpers.REPO / "configs" / "finetune" / "long_range.py", "reformer_4096")
    c.data.update(long_range_tokens=64, long_range_prefix=16, long_range_train=2, long_range_eval=2,
                  max_seq_length=64, cache_dir=str(tmp_path))
    # HF's N(0, 1) axial tables, where the bars below were set (the preset's N(0, 0.02) leaves 4 of 16,384
    # gradient entries up to 3.6e-6 apart: float32 recomputation through the reversible stack)
    c.model.update(max_position_embeddings=64, axial_pos_shape=[8, 8], lsh_attn_chunk_length=16,
                   local_attn_chunk_length=16, dropout_rate=0.1, axial_norm_std=1.0)
    job = finetune.encoder_job(c, tasks.get("long_range"))
    example = {k: np.asarray(v) for k, v in job.example.items()}
    params = nn.meta.unbox(jax.jit(job.model.init)(jax.random.key(0), example))["params"]
    pretraining = models.build(c.model.to_dict())
    pretrained = nn.meta.unbox(jax.eval_shape(pretraining.init, jax.random.key(0), example))["params"]
    assert set(params) == {"encoder", "head"}
    assert jax.tree.structure(params["encoder"]) == jax.tree.structure(reformer.trunk(pretrained))

    cfg = models.encoder_config(c.model)
    trunk = reformer.Reformer(cfg)
    state = jax.jit(trunk.apply)({"params": params["encoder"]}, example)["sequence"][:, 0]
    head = params["head"]
    np.testing.assert_allclose(jax.jit(job.model.apply)({"params": params}, example)["logits"],
                               state @ head["kernel"] + head["bias"], rtol=1e-5, atol=1e-5)

    def grads(reversible):
        network = reformer.TaskTrunk(cfg, reversible)
        weights = jax.random.normal(jax.random.key(1), (2 * cfg.hidden_size,))
        return jax.jit(jax.grad(lambda p: jnp.sum(network.apply({"params": p}, example, deterministic=False,
                                                                rngs={"dropout": jax.random.key(2)})["pooled"] @ weights)))(
            params["encoder"])

    got, want = grads(True), grads(False)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want)) > 1e-3
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, want)
