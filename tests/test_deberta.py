"""DeBERTa-v3 (He et al. 2023, arXiv 2111.09543; DeBERTa-v2's network), end to end: a random Hugging
Face `DebertaV2ForMaskedLM` in the v3 setting (disentangled c2p + p2c attention over log-bucketed
relative positions, no position table, padding in the batch) imported and compared with
transformers at every hidden state and logit, exported back and reloaded; the log buckets against
HF's function and an independent numpy reference; the score terms at chosen rows, under a
scanned stack and under shifted positions; the tiny config learning; the presets' shapes against
HF's network; and DeBERTa-v3's gradient-disentangled embedding sharing (the discriminator's
gradient never reaching the generator's table)."""

import dataclasses
import functools
import os

import flax.linen as nn
import helpers
import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from bertology import models, validation
from bertology.errors import UserError
from bertology.families.deberta.model import Config, log_bucket
from bertology.interop import export_hf, hf_config, import_hf, names, records
from bertology.models.transformer import stack_layers
from bertology.train.checkpoint import load_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, L, V = 3, 20, 97
LENGTHS = (20, 15, 6)
TOLERANCE = 1e-4  # float32 parity, as tests/test_interop.py
# held-out shapes: 2 layers, hidden 32, 4 heads, 8 buckets up to distance 32 over 20-token rows
# (so distances past 4 fall in log buckets, and the far ones clip)
V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False, share_att_key=True,
          norm_rel_ebd="layer_norm", type_vocab_size=0)
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, position_buckets=8, max_relative_positions=32, layer_norm_eps=1e-7, **V3)


def build_hf(seed=0):
    """A random HF DebertaV2ForMaskedLM (float32): every tensor, LayerNorm scales and the relative
    table too, drawn from N(0, 0.2), so a swapped, missed or misplaced tensor shows."""
    torch.manual_seed(seed)
    model = transformers.DebertaV2ForMaskedLM._from_config(transformers.DebertaV2Config(**SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def make_batch():
    rng = np.random.default_rng(0)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, V, (B, L)), 0).astype(np.int32)
    positions = np.broadcast_to(np.arange(L, dtype=np.int32), (B, L))
    return dict(input_ids=ids, input_mask=mask, masked_positions=positions)


hf_outputs = helpers.hf_outputs


our_outputs = functools.partial(helpers.our_outputs, "deberta")


# --- import matches transformers; export reloads in transformers ---------------------------------------

def test_import_matches_transformers_and_round_trips(tmp_path):
    hf = build_hf()
    batch = make_batch()
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type) == ("deberta", "deberta-v2")
    assert report.fresh == [] and report.unused == []

    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert {k: block[k] for k in ("norm", "positions", "type_vocab_size", "position_buckets",
                                  "max_relative_positions", "pooler")} == dict(
        norm="post", positions="none", type_vocab_size=0, position_buckets=8, max_relative_positions=32, pooler=False)
    flat = set(flatten_dict(params))
    rows = names.tensors(records.registry()["deberta-v2"].layout, flat)
    assert {r.ours for r in rows} == flat, "every parameter has a row in the name map"
    assert params["encoder"]["relative_embeddings"]["embedding"].shape == (16, 32)  # 2 · buckets rows

    reference = hf_outputs(hf, batch)
    diffs = helpers.max_diff(our_outputs(params, block, batch), reference, batch["input_mask"])
    print(f"\ndeberta max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs; "
          f"mlm {diffs['mlm']:.2e}; logits scale {np.abs(reference['mlm']).max():.1f})")
    assert len(diffs) == SMALL["num_hidden_layers"] + 2  # embeddings, each layer, MLM
    assert max(diffs.values()) <= TOLERANCE, diffs

    # The test can tell the relative settings apart: the same tensors with the log buckets reaching
    # 64 instead of 32 (distances 5..19 fall in other buckets) are off, far beyond the parity seen.
    wrong_cfg = dataclasses.replace(models.encoder_config(block), max_relative_positions=64)
    wrong = helpers.max_diff(our_outputs(params, block, batch, cfg=wrong_cfg), reference, batch["input_mask"])
    print(f"the same tensors, buckets reaching 64: mlm {wrong['mlm']:.2e}")
    assert wrong["mlm"] > max(TOLERANCE, 100 * max(diffs.values())), wrong

    exported = export_hf(tmp_path / "run", tmp_path / "export")
    assert exported == [tmp_path / "export"]
    reloaded, info = transformers.DebertaV2ForMaskedLM.from_pretrained(exported[0], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert {k: getattr(reloaded.config, k) for k in SMALL} == SMALL  # the shape and the v3 setting, as exported
    round_trip = helpers.max_diff(hf_outputs(reloaded.eval(), batch), reference, batch["input_mask"])
    print(f"deberta round trip max abs diff: {max(round_trip.values()):.2e}")
    assert max(round_trip.values()) <= 1e-6, round_trip


def test_import_refuses_other_deberta_settings(tmp_path):
    """v2's absolute positions (position_biased_input) or c2p alone compute another network: refused."""
    for key, value in (("position_biased_input", True), ("pos_att_type", ["c2p"])):
        config = transformers.DebertaV2Config(**{**SMALL, key: value})
        transformers.DebertaV2ForMaskedLM._from_config(config).save_pretrained(tmp_path / key)
        with pytest.raises(UserError, match=f"{key}=.* is not reproduced"):
            import_hf(tmp_path / key, tmp_path / f"run_{key}")


def test_the_family_refuses_other_settings():
    base = dict(family="deberta", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    cfg = models.encoder_config(base)
    assert isinstance(cfg, Config) and (cfg.norm, cfg.positions, cfg.type_vocab_size, cfg.pooler) == (
        "post", "none", 0, False)
    assert (cfg.position_buckets, cfg.span) == (256, 256)
    for key, value in (("positions", "absolute"), ("norm", "pre"), ("type_vocab_size", 2)):
        with pytest.raises(UserError, match=f"model.{key}={value!r}: DeBERTa-v3 has"):
            models.build({**base, key: value})
    with pytest.raises(UserError, match="position_buckets=256 needs"):
        models.encoder_config({**base, "max_relative_positions": 100})


# --- the log buckets ------------------------------------------------------------------------------------------

def numpy_log_bucket(relative, buckets, max_position):
    """The bucket of each relative position, written from the paper's description (DeBERTa-v2's
    log buckets, HF `make_log_bucket_position`) in float64 numpy: identity within half the
    buckets, then a log scale reaching `max_position` at the last bucket."""
    mid = buckets // 2
    out = relative.astype(np.int64).copy()
    far = np.abs(relative) > mid
    d = np.abs(relative[far]).astype(np.float64)
    out[far] = np.sign(relative[far]) * (mid + np.ceil(np.log(d / mid) / np.log((max_position - 1) / mid) * (mid - 1)))
    return out


@pytest.mark.parametrize("buckets, max_position", [(8, 32), (32, 128), (256, 512)])
def test_log_bucket_is_hf_function_and_numpy_reference(buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = np.arange(-3 * max_position, 3 * max_position + 1)[None, :] - np.zeros((1, 1), np.int64)
    ours = np.asarray(log_bucket(relative.astype(np.int32), buckets, max_position))
    hf = make_log_bucket_position(torch.tensor(relative), buckets, max_position).numpy()
    np.testing.assert_array_equal(ours, hf)
    np.testing.assert_array_equal(ours, numpy_log_bucket(relative, buckets, max_position))
    mid = buckets // 2
    assert np.array_equal(ours[np.abs(relative) <= mid], relative[np.abs(relative) <= mid])
    assert ours[relative == max_position - 1] == buckets - 1 and ours[relative == 1 - max_position] == 1 - buckets
    assert np.array_equal(ours, -ours[:, ::-1])  # odd: δ(j, i) = -δ(i, j)


# --- the score terms at chosen rows, and in a scanned stack --------------------------------------------------

def _tiny_model(**overrides):
    cfg = models.encoder_config(dict(family="deberta", vocab_size=V, hidden_size=32, num_layers=2, num_heads=4,
                                     intermediate_size=48, position_buckets=8, max_relative_positions=32,
                                     dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.2,
                                     **overrides))
    return cfg, models.family("deberta").task_trunk(cfg, "encoder")


def test_rows_scan_and_shift_invariance():
    """The last layer run only at the MLM rows equals the full layer gathered there (the relative
    terms follow the query's own position); a scanned stack (`scan_layers`) computes what the
    unrolled one does with the same parameters; and the row's positions shifted by 3 change
    nothing, since every term reads positions only through i - j (no absolute table)."""
    cfg, enc = _tiny_model()
    _, scanned = _tiny_model(scan_layers=True)
    batch = make_batch()
    params = nn.meta.unbox(jax.jit(enc.init)(jax.random.key(0), batch))["params"]
    rows = np.array([[3, 0, 17], [14, 2, 9], [5, 1, 0]], np.int32)

    @jax.jit  # one compilation for the four
    def run(params):
        return (enc.apply({"params": params}, batch)["sequence"],
                enc.apply({"params": params}, batch, outputs_at=rows)["sequence"],
                scanned.apply({"params": stack_layers(params)}, batch)["sequence"],
                enc.apply({"params": params}, dict(batch, positions=batch["masked_positions"] + 3))["sequence"])

    full, at, scan, shifted = (np.asarray(x) for x in run(params))
    np.testing.assert_allclose(at, np.take_along_axis(full, rows[..., None], 1), atol=1e-5)
    np.testing.assert_allclose(scan, full, atol=1e-5)
    real = batch["input_mask"].astype(bool)
    np.testing.assert_allclose(shifted[real], full[real], atol=1e-5)
    assert cfg.span == 8


# --- the tiny config learns -------------------------------------------------------------------------------------

def test_tiny_learns(tmp_path):
    """30 steps of the tiny preset's MLM on the embedded corpus: the loss falls."""
    from bertology.train.loop import train

    c = helpers.short_run_config("deberta", "tiny", total_steps=30, log_every=1, **{
        "optimizer.warmup_steps": 5})
    mlm = np.array([h["mlm_loss"] for h in train(c, tmp_path / "run")["history"]])
    print(f"\ndeberta tiny mlm loss: first 5 {mlm[:5].mean():.3f}, last 5 {mlm[-5:].mean():.3f}")
    assert len(mlm) == 30
    assert mlm[-5:].mean() < mlm[:5].mean() - 0.75, mlm  # nats: far beyond step-to-step noise


# --- presets ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["tiny", "base", "large", "tiny_rtd", "large_rtd"])
def test_presets_pass_validation(preset):
    c = helpers.config("deberta", preset)
    c.model.vocab_size = c.model.vocab_size or 8192
    validation.check(c)


@pytest.mark.parametrize("preset, shape", [
    # microsoft/deberta-v3-base and -large (He et al. 2023, Table 2)
    ("base", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)),
    ("large", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)),
])
def test_released_presets_are_hf_shapes(preset, shape):
    """The base and large presets build HF's network, tensor for tensor (on torch's meta device),
    and export to that config."""
    c = helpers.config("deberta", preset)
    batch = {"input_ids": np.zeros((1, 4), np.int32), "masked_positions": np.zeros((1, 4), np.int32),
             "input_mask": np.ones((1, 4), np.int32)}
    params = jax.eval_shape(lambda: nn.meta.unbox(models.build(c.model).init(jax.random.key(0), batch)))["params"]
    ours = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    hf_shape = dict(vocab_size=128100, position_buckets=256, max_relative_positions=-1, max_position_embeddings=512,
                    layer_norm_eps=1e-7, **shape, **V3)
    with torch.device("meta"):
        hf = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**hf_shape))
    assert ours == sum(p.numel() for p in hf.parameters())  # the tied decoder counted once on both sides
    print(f"\ndeberta-v3 {preset}: {ours / 1e6:.1f}M parameters")
    block = c.model.to_dict()
    record = records.for_run(block)
    assert record.model_type == "deberta-v2"
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    assert {k: exported[k] for k in hf_shape} == hf_shape


# --- DeBERTa-v3's RTD with gradient-disentangled embedding sharing ------------------------------------------

def test_gdes_stops_the_discriminator_gradient_at_the_generator_table():
    """Under GDES (He et al. 2023, section 3.2) the discriminator reads stop_gradient(E_G) + E_Δ:
    its loss moves E_Δ but never the generator's table E_G, which the generator's MLM loss trains;
    E_Δ starts at zero, and `trunk` is the discriminator with the summed table, equal to the
    discriminator's own encoder."""
    c = helpers.config("deberta", "tiny_rtd")
    c.model.update(vocab_size=V, num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    model = models.build(c.model)
    assert (model.embedding_sharing, model.generator_cfg.num_layers, model.generator_cfg.hidden_size) == (
        "gdes", 1, c.model.hidden_size)
    batch = dict(make_batch(), masked_positions=np.array([[1, 3], [2, 4], [0, 5]], np.int32))
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch))["params"]
    assert set(params) == {"discriminator", "generator", "token_delta"}
    assert "token" not in params["discriminator"]["encoder"]["embeddings"]
    assert not np.asarray(params["token_delta"]["delta"]).any()
    record = models.family("deberta")
    trunk = record.task_trunk(models.encoder_config(c.model), "encoder")

    @jax.jit  # one compilation for the gradients and both encoders
    def run(params, delta):
        disc, gen = (jax.grad(lambda p, m=m: model.apply({"params": p}, batch, method=m).sum())(params)
                     for m in ("discriminate", "generate"))
        params = {**params, "token_delta": {"delta": delta}}
        inside = model.apply({"params": params}, batch, method=lambda m, b: m.discriminator.encoder(b)["sequence"])
        alone = trunk.apply({"params": record.trunk(params)}, batch)["sequence"]
        return disc, gen, inside, alone

    delta = jax.random.normal(jax.random.key(1), params["token_delta"]["delta"].shape) * 0.1
    disc, gen, inside, alone = run(params, delta)

    def table(g):
        return np.abs(np.asarray(g["generator"]["encoder"]["embeddings"]["token"]["embedding"])).max()

    assert table(disc) == 0.0 and np.abs(np.asarray(disc["token_delta"]["delta"])).max() > 0
    assert table(gen) > 0 and not np.asarray(gen["token_delta"]["delta"]).any()
    np.testing.assert_allclose(np.asarray(alone), np.asarray(inside), atol=1e-5)
