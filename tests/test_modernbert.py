"""ModernBERT (Warner et al. 2024, arXiv 2412.13663), end to end: a random Hugging Face
`ModernBertForMaskedLM` (global and sliding-window layers, rows longer than the window, padding)
imported and compared with transformers, exported back and reloaded; the window doing what it
says, to the key; the rotary embedding against HF's formula; the tiny config learning; the
presets' shapes against HF's released configs; and the core knobs' defaults leaving every other
family unchanged."""

import dataclasses
import functools
import inspect
import os

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from bertology import models, validation
from bertology.errors import UserError
from bertology.interop import export_hf, hf_config, import_hf, names, records
from bertology.models.transformer import Attention, Encoder, Mask, TransformerConfig, rotary
from bertology.train.checkpoint import load_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, L, V = 3, 24, 97
LENGTHS = (24, 19, 7)
TOLERANCE = 1e-4  # float32 parity, as tests/test_interop.py
# 3 layers: 0 global, 1 and 2 local; a window of 8 (4 keys each side) over 24-token rows; distinct rope bases
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3,
             global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             cls_token_id=1, sep_token_id=2, reference_compile=False)


# the keys that say which layers are global and each kind's rotary base, as transformers 4 and 5 write them
LAYOUT_V4 = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")
LAYOUT_V5 = ("layer_types", "rope_parameters")


def load_config(preset):
    return helpers.config("modernbert", preset)


def build_hf(seed=0):
    """A random HF ModernBertForMaskedLM (eager attention, float32): every tensor, LayerNorm scales
    and the decoder bias too, drawn from N(0, 0.2), so a swapped, missed or misplaced tensor shows."""
    torch.manual_seed(seed)
    config = transformers.ModernBertConfig(**SMALL)
    model = transformers.ModernBertForMaskedLM._from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def make_batch():
    """Padded rows longer than the window; the MLM head read at every position."""
    rng = np.random.default_rng(0)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, V, (B, L)), 0).astype(np.int32)
    positions = np.broadcast_to(np.arange(L, dtype=np.int32), (B, L))
    return dict(input_ids=ids, input_mask=mask, masked_positions=positions)


def hf_outputs(model, batch):
    """HF's hidden states with the last one after the final norm (HF's own last entry is before it)."""
    out = helpers.hf_outputs(model, batch)
    with torch.no_grad():
        last = model.model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                           attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long)).last_hidden_state
    return {**out, f"hidden_{len(out) - 2}": last.numpy()}


our_outputs = functools.partial(helpers.our_outputs, "modernbert")


# --- import matches transformers; export reloads in transformers ---------------------------------------

def test_import_matches_transformers_and_round_trips(tmp_path):
    hf = build_hf()
    batch = make_batch()
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type) == ("modernbert", "modernbert")
    assert report.fresh == [] and report.unused == []

    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert {k: block[k] for k in ("norm", "positions", "activation", "use_bias", "norm_bias", "first_attention_norm",
                                  "local_attention", "global_attn_every_n_layers", "rope_theta",
                                  "local_rope_theta")} == dict(
        norm="pre", positions="rotary", activation="geglu", use_bias=False, norm_bias=False,
        first_attention_norm=False, local_attention=8, global_attn_every_n_layers=3, rope_theta=160000.0,
        local_rope_theta=10000.0)
    flat = set(flatten_dict(params))
    rows = names.tensors(records.registry()["modernbert"].layout, flat)
    assert {r.ours for r in rows} == flat, "every parameter has a row in the name map"
    assert ("encoder", "attention_0", "norm", "scale") not in flat and ("encoder", "attention_1", "norm", "scale") in flat
    assert not any(k[-1] == "bias" for k in flat if k[:2] != ("mlm", "bias")), "no biases but the decoder's"

    reference = hf_outputs(hf, batch)
    diffs = helpers.max_diff(our_outputs(params, block, batch), reference, batch["input_mask"])
    print(f"\nmodernbert max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs; "
          f"mlm {diffs['mlm']:.2e}; logits scale {np.abs(reference['mlm']).max():.1f})")
    assert len(diffs) == SMALL["num_hidden_layers"] + 2  # embeddings, each layer (the last after the final norm), MLM
    assert max(diffs.values()) <= TOLERANCE, diffs

    # The test can tell the settings apart: the same tensors with global attention everywhere, a
    # window one key wider each side, the GELU on Wi's second half instead of its first, or one
    # rope base for every layer are off (the last least: within the 4-key window the two bases'
    # angles differ little at head width 8).
    cfg = models.encoder_config(block)
    swapped = {**params, "encoder": {**params["encoder"], **{
        f"ffn_{i}": {**params["encoder"][f"ffn_{i}"], "intermediate": params["encoder"][f"ffn_{i}"]["intermediate_linear"],
                     "intermediate_linear": params["encoder"][f"ffn_{i}"]["intermediate"]}
        for i in range(SMALL["num_hidden_layers"])}}}
    for name, wrong_cfg, wrong_params, margin in (
            ("global everywhere", dataclasses.replace(cfg, local_attention=None), params, 100),
            ("window one wider", dataclasses.replace(cfg, local_attention=10), params, 100),
            ("gate and input swapped", cfg, swapped, 100),
            ("one rope base", dataclasses.replace(cfg, local_rope_theta=None), params, 10)):
        wrong = helpers.max_diff(our_outputs(wrong_params, block, batch, cfg=wrong_cfg), reference, batch["input_mask"])
        print(f"the same tensors, {name}: mlm {wrong['mlm']:.2e}")
        assert wrong["mlm"] > margin * TOLERANCE, (name, wrong)
    # The erf GELU (HF's ACT2FN["gelu"]), not its tanh approximation: close, yet far beyond the parity seen.
    tanh = helpers.max_diff(our_outputs(params, block, batch, cfg=dataclasses.replace(cfg, activation="gated_gelu")),
                            reference, batch["input_mask"])
    print(f"the same tensors, tanh-GELU: mlm {tanh['mlm']:.2e}")
    assert max(tanh.values()) > 20 * max(diffs.values()), (tanh, diffs)

    exported = export_hf(tmp_path / "run", tmp_path / "export")
    assert exported == [tmp_path / "export"]
    reloaded, info = transformers.ModernBertForMaskedLM.from_pretrained(exported[0], output_loading_info=True,
                                                                        attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    # the shape, as exported: transformers 4 keeps SMALL's layer pattern and rope keys, 5 its
    # `layer_types` and `rope_parameters`
    shape = [k for k in (*SMALL, *LAYOUT_V5) if k != "reference_compile" and not k.endswith("_token_id")
             and hasattr(hf.config, k)]
    assert {k: getattr(reloaded.config, k) for k in shape} == {k: getattr(hf.config, k) for k in shape}
    round_trip = helpers.max_diff(hf_outputs(reloaded.eval(), batch), reference, batch["input_mask"])
    print(f"modernbert round trip max abs diff: {max(round_trip.values()):.2e}")
    assert max(round_trip.values()) <= 1e-6, round_trip


def test_the_family_refuses_other_settings():
    base = dict(family="modernbert", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    cfg = models.encoder_config(base)
    assert (cfg.norm, cfg.positions, cfg.activation, cfg.use_bias, cfg.norm_bias) == ("pre", "rotary", "geglu", False,
                                                                                     False)
    for key, value in (("norm", "post"), ("positions", "absolute"), ("activation", "gelu"), ("use_bias", True)):
        with pytest.raises(UserError, match=f"model.{key}={value!r}: ModernBERT has"):
            models.build(ml_collections.ConfigDict({**base, key: value}))


def test_layer_pattern_and_rope_read_from_either_transformers_layout():
    """transformers 4 writes the layer pattern and rotary bases as `global_attn_every_n_layers`,
    `global_rope_theta` and `local_rope_theta`, 5 as `layer_types` and `rope_parameters` by layer
    type: each imports alike, as does the installed transformers' own config (a config.json
    without them: its defaults), export writes both, and a pattern or rope type we do not compute
    is refused."""
    record = records.registry()["modernbert"]
    kept = ("rope_theta", "local_rope_theta", "global_attn_every_n_layers")

    def read(hf):
        return {k: v for k, v in hf_config.from_hf(record, {"model": hf}, {"model": "hf"}).items() if k in kept}

    base = {k: v for k, v in SMALL.items() if k not in LAYOUT_V4}
    v4 = {**base, "global_attn_every_n_layers": 2, "global_rope_theta": 5e4, "local_rope_theta": 1e3}
    v5 = {**base, "layer_types": ["full_attention", "sliding_attention", "full_attention"],
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e4},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}}
    want = dict(rope_theta=5e4, local_rope_theta=1e3, global_attn_every_n_layers=2)
    assert read(v4) == read(v5) == read(transformers.ModernBertConfig(**v4).to_dict()) == want
    assert read(base) == read(transformers.ModernBertConfig(**base).to_dict()) == dict(
        rope_theta=160000.0, local_rope_theta=10000.0, global_attn_every_n_layers=3)
    block = hf_config.from_hf(record, {"model": v5}, {"model": "hf"})
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    assert read({k: v for k, v in exported.items() if k not in LAYOUT_V5}) == want
    assert read({k: v for k, v in exported.items() if k not in LAYOUT_V4}) == want
    with pytest.raises(UserError, match="layer_types"):
        read({**v5, "layer_types": ["full_attention", "full_attention", "sliding_attention"]})
    with pytest.raises(UserError, match="rope_type"):
        read({**v5, "rope_parameters": {**v5["rope_parameters"], "sliding_attention": {
            "rope_type": "linear", "factor": 2.0, "rope_theta": 1e3}}})


# --- the sliding window and the rotary embedding -------------------------------------------------------------

def _attention_outputs(local, x, window):
    cfg = TransformerConfig(vocab_size=10, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32,
                            norm="pre", positions="rotary", local_attention=window, global_attn_every_n_layers=3,
                            dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.1)
    module = Attention(cfg, local=local)
    positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
    mask = Mask(keys=jnp.ones(x.shape[:2], bool), positions=positions)
    params = module.init(jax.random.key(0), x, mask, None, True)
    return lambda y: np.asarray(module.apply(params, y, mask, None, True))


@pytest.mark.parametrize("local", [True, False])
def test_a_far_token_reaches_a_global_layer_but_not_a_local_one(local):
    """Changing the token at position 20 changes a local layer's outputs exactly where the query is
    at most local_attention // 2 = 4 positions away (HF: `distance <= local_attention // 2`), and a
    global layer's everywhere."""
    x = jax.random.normal(jax.random.key(1), (1, 40, 16))
    run = _attention_outputs(local, x, window=8)
    other = x.at[:, 20].set(jax.random.normal(jax.random.key(2), (1, 16)))  # a new token at 20 (not a shift: the norm removes it)
    changed = np.abs(run(other) - run(x)).max(-1)[0] > 0  # a key outside the window weighs exactly 0
    expect = np.abs(np.arange(40) - 20) <= 4 if local else np.ones(40, bool)
    np.testing.assert_array_equal(changed, expect)


def test_the_stack_alternates_local_and_global_layers():
    """Layer i is global when i % 3 == 0: a far-away token reaches position 0 through layer 0 and
    layer 3, and the hidden states of a model without windows differ."""
    c = load_config("tiny")
    c.model.update(vocab_size=50, num_layers=4, local_attention=4)
    cfg = models.encoder_config(c.model)
    assert [cfg.is_local(i) for i in range(4)] == [False, True, True, False]
    ids = np.random.default_rng(0).integers(5, 50, (1, 32)).astype(np.int32)
    batch = dict(input_ids=ids, input_mask=np.ones_like(ids))
    enc = Encoder(cfg)
    params = enc.init(jax.random.key(0), batch)
    far = dict(batch, input_ids=ids.copy())
    far["input_ids"][0, 30] = (ids[0, 30] + 1) % 50
    a, b = enc.apply(params, batch)["layers"], enc.apply(params, far)["layers"]
    # after layer 0 (global) position 0 has seen position 30; a 4-layer all-local stack with a
    # 2-key window could not carry it 30 positions
    assert np.abs(np.asarray(a[1] - b[1]))[0, 0].max() > 1e-4
    wide = Encoder(dataclasses.replace(cfg, local_attention=None)).apply(params, batch)["layers"]
    assert np.abs(np.asarray(wide[2] - a[2])).max() > 1e-3  # layer 1 is local: a global one differs


def test_rotary_is_hf_formula_and_relative():
    """`rotary` equals transformers' `apply_rotary_pos_emb` with ModernBERT's rotary embedding, and
    a query-key product depends on the two positions through their difference only."""
    from transformers.models.modernbert import modeling_modernbert as mm

    d, theta = 8, 10000.0
    x = np.random.default_rng(0).normal(size=(2, 5, 3, d)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 9, 11, 13, 100]], np.int32)
    config = transformers.ModernBertConfig(hidden_size=3 * d, num_attention_heads=3, global_rope_theta=theta)
    rope = mm.ModernBertRotaryEmbedding(config)
    # transformers 5 holds one table per layer type and takes the type
    kind = {"layer_type": "full_attention"} if "layer_type" in inspect.signature(rope.forward).parameters else {}
    cos, sin = rope(torch.zeros(1), torch.tensor(pos, dtype=torch.long), **kind)
    xt = torch.tensor(x).transpose(1, 2)  # HF's [batch, heads, length, head_dim]
    ref, _ = mm.apply_rotary_pos_emb(xt, xt, cos, sin)
    np.testing.assert_allclose(np.asarray(rotary(jnp.asarray(x), jnp.asarray(pos), theta)),
                               ref.transpose(1, 2).numpy(), atol=1e-5)
    q, k = (jnp.asarray(x[:1, :1]) for _ in range(2))
    dots = [float(jnp.sum(rotary(q, jnp.array([[p]]), theta) * rotary(k, jnp.array([[p + 3]]), theta)))
            for p in (0, 5, 50)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-4)


# --- the tiny config learns -------------------------------------------------------------------------------------

def test_tiny_learns(tmp_path):
    """30 steps of the tiny preset's MLM (30% masking) on the embedded corpus: the loss falls."""
    from bertology.train.loop import train

    c = helpers.short_run_config("modernbert", "tiny", total_steps=30, log_every=1, **{
        "data.max_seq_length": 64, "data.max_predictions_per_seq": 20, "optimizer.warmup_steps": 5})
    assert c.data.masked_lm_prob == 0.3
    mlm = np.array([h["mlm_loss"] for h in train(c, tmp_path / "run")["history"]])
    print(f"\nmodernbert tiny mlm loss: first 5 {mlm[:5].mean():.3f}, last 5 {mlm[-5:].mean():.3f}")
    assert len(mlm) == 30
    assert mlm[-5:].mean() < mlm[:5].mean() - 0.75, mlm  # nats: far beyond step-to-step noise


# --- presets ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["tiny", "base", "large"])
def test_presets_pass_validation(preset):
    c = load_config(preset)
    c.model.vocab_size = c.model.vocab_size or 8192
    validation.check(c)


@pytest.mark.parametrize("preset, hf_overrides", [
    ("base", {}),
    # answerdotai/ModernBERT-large's config.json
    ("large", dict(hidden_size=1024, intermediate_size=2624, num_hidden_layers=28, num_attention_heads=16)),
])
def test_released_presets_are_hf_shapes(preset, hf_overrides):
    """The base and large presets build HF's network, tensor for tensor (built on torch's meta
    device), and export to that config."""
    c = load_config(preset)
    batch = {"input_ids": np.zeros((1, 4), np.int32), "masked_positions": np.zeros((1, 4), np.int32),
             "input_mask": np.ones((1, 4), np.int32)}
    params = jax.eval_shape(lambda: nn.meta.unbox(models.build(c.model).init(jax.random.key(0), batch)))["params"]
    ours = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    with torch.device("meta"):
        hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_overrides))
    assert ours == sum(p.numel() for p in hf.parameters())  # the tied decoder counted once on both sides
    print(f"\nmodernbert {preset}: {ours / 1e6:.1f}M parameters")
    block = c.model.to_dict()
    record = records.for_run(block)
    assert record.model_type == "modernbert"
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    default = transformers.ModernBertConfig(**hf_overrides)
    assert {k: exported[k] for k in record.defaults if k in exported} == {
        k: getattr(default, k) for k in record.defaults if k in exported}
    loaded = transformers.ModernBertConfig.from_dict(exported)
    layout = [k for k in (*LAYOUT_V4, *LAYOUT_V5) if hasattr(default, k)]
    assert layout and {k: getattr(loaded, k) for k in layout} == {k: getattr(default, k) for k in layout}


# --- the core knobs' defaults -------------------------------------------------------------------------------

def test_new_knobs_off_by_default():
    cfg = TransformerConfig()
    assert (cfg.norm_bias, cfg.first_attention_norm, cfg.local_attention, cfg.positions) == (True, True, None,
                                                                                             "absolute")
    assert not cfg.has_local_layers and not any(cfg.is_local(i) for i in range(cfg.num_layers))
    with pytest.raises(UserError, match="scan_layers"):
        TransformerConfig(norm="pre", local_attention=8, global_attn_every_n_layers=3, scan_layers=True)
    with pytest.raises(UserError, match="first_attention_norm"):
        TransformerConfig(first_attention_norm=False)


def test_flops_per_token_is_the_hand_count():
    """The GeGLU block's two input projections counted; no pooler or sentence head; attention over
    the whole row (the xla backend computes a window's full scores, masked)."""
    c = load_config("tiny")
    c.model.vocab_size = v = 8000
    n, h, i, s, p = 3, 128, 256, 128, 39  # layers, width, GeGLU width, sequence, predictions (the tiny recipe)
    assert (c.model.num_layers, c.model.hidden_size, c.model.intermediate_size) == (n, h, i)
    assert (c.data.max_seq_length, c.data.max_predictions_per_seq) == (s, p)
    keys_values = 2 * 2 * h * h
    per_query = 2 * 2 * h * h + 2 * h * (2 * i) + 2 * i * h + 2 * 2 * s * h  # query, output; Wi (2I), Wo; attention
    encoder = n * keys_values + (n - 1) * per_query + per_query * (p + 1) / s
    mlm = (2 * h * h + 2 * h * v) * p / s
    assert models.flops_per_token(c) == pytest.approx(3 * (encoder + mlm), rel=1e-12)
