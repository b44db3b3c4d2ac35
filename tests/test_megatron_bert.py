"""Megatron-BERT, end to end: a random Hugging Face `MegatronBertForPreTraining` imported and compared
with transformers (every hidden state, MLM and NSP logits), exported back and reloaded; the tiny
config learning on 1 and 8 devices alike; the FLOP count against a hand count; where its trunk's
parameters sit among the layers; the 345m preset against HF's released shape."""

import dataclasses
import functools
import os

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

import helpers
from flax.traverse_util import flatten_dict

from bertology import models, validation
from bertology.errors import UserError
from bertology.interop import export_hf, hf_config, import_hf, names, records
from bertology.models import layout
from bertology.train import optimizer, prune
from bertology.train.checkpoint import load_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, L, V = 3, 12, 97
LENGTHS = (12, 9, 4)
TOLERANCE = 1e-4  # float32 parity, as tests/test_interop.py
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=16, hidden_act="gelu")


def load_config(preset):
    return helpers.config("megatron_bert", preset)


def build_hf(seed=0):
    """A random HF MegatronBertForPreTraining: every tensor (LayerNorms and biases too) drawn from
    N(0, 0.2), so a swapped, missed or misplaced tensor shows in the outputs."""
    torch.manual_seed(seed)
    model = transformers.MegatronBertForPreTraining(transformers.MegatronBertConfig(**SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def make_batch():
    """Padded rows of two segments; the MLM head read at every position."""
    rng = np.random.default_rng(0)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, V, (B, L)), 0).astype(np.int32)
    segments = ((np.arange(L)[None] >= np.array(LENGTHS)[:, None] // 2) * mask).astype(np.int32)
    positions = np.broadcast_to(np.arange(L, dtype=np.int32), (B, L))
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments, masked_positions=positions)


hf_outputs = functools.partial(helpers.hf_outputs, inputs=("input_ids", "input_mask", "segment_ids"),
                               heads={"mlm": "prediction_logits", "nsp": "seq_relationship_logits"})


our_outputs = functools.partial(helpers.our_outputs, "megatron_bert", heads=("mlm", "nsp"))


# --- (a) import matches transformers, (b) export reloads in transformers ----------------------------

def test_import_matches_transformers_and_round_trips(tmp_path):
    hf = build_hf()
    batch = make_batch()
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type) == ("megatron_bert", "megatron-bert")
    assert report.fresh == [] and report.unused == []

    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert (block["norm"], block["embedding_norm"], block["pooler"]) == ("pre", False, True)
    rows = names.tensors(records.registry()["megatron-bert"].layout, set(flatten_dict(params)))
    assert {r.ours for r in rows} == set(flatten_dict(params)), "every parameter has a row in the name map"

    reference = hf_outputs(hf, batch)
    diffs = helpers.max_diff(our_outputs(params, block, batch), reference, batch["input_mask"])
    print(f"\nmegatron-bert max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs; "
          f"mlm {diffs['mlm']:.2e}, nsp {diffs['nsp']:.2e})")
    assert len(diffs) == SMALL["num_hidden_layers"] + 3  # embeddings, each layer (the last after the final norm), 2 heads
    assert max(diffs.values()) <= TOLERANCE, diffs

    # The test can tell the architectures apart: BERT's post-LN on the same tensors is far off.
    post = dataclasses.replace(models.encoder_config(block), norm="post")
    wrong = helpers.max_diff(our_outputs(params, block, batch, cfg=post), reference, batch["input_mask"])
    print(f"the same tensors under BERT's post-LN: mlm {wrong['mlm']:.2e}, nsp {wrong['nsp']:.2e}")
    assert min(wrong["mlm"], wrong["nsp"]) > 100 * TOLERANCE, wrong

    exported = export_hf(tmp_path / "run", tmp_path / "export")
    assert exported == [tmp_path / "export"]
    reloaded, info = transformers.MegatronBertForPreTraining.from_pretrained(exported[0], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert reloaded.config.to_dict() | SMALL == reloaded.config.to_dict()  # the shape, as exported
    round_trip = helpers.max_diff(hf_outputs(reloaded.eval(), batch), reference, batch["input_mask"])
    print(f"megatron-bert round trip max abs diff: {max(round_trip.values()):.2e}")
    assert max(round_trip.values()) <= 1e-6, round_trip


def test_the_family_refuses_bert_settings():
    base = dict(family="megatron_bert", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    assert (models.encoder_config(base).norm, models.encoder_config(base).embedding_norm) == ("pre", False)
    for key, value in (("norm", "post"), ("embedding_norm", True)):
        with pytest.raises(UserError, match=f"model.{key}={value!r}: Megatron-BERT has"):
            models.build(ml_collections.ConfigDict({**base, key: value}))


# --- (c) the tiny config learns, on 1 and on 8 devices alike ---------------------------------------

@pytest.mark.slow
def test_tiny_learns_on_one_and_eight_devices_and_fine_tunes(tmp_path):
    from helpers import sst2_from

    from bertology.train.loop import train

    runs = {}
    # tests/test_families.py's pattern: one device learns for 50 steps, eight repeat its first 15.
    for shape, steps in [((1, 1), 50), ((8, 1), 15)]:
        c = load_config("tiny")
        c.batch_size, c.total_steps, c.log_every, c.eval_every, c.checkpoint_every = 8, steps, 1, 0, 1000
        c.optimizer.warmup_steps, c.optimizer.schedule_steps = 10, 50
        c.data.max_seq_length, c.data.max_predictions_per_seq = 64, 10
        c.mesh.shape = shape
        runs[shape] = [(h["loss"], h["mlm_loss"], h["nsp_loss"]) for h in train(c, tmp_path / str(shape))["history"]]
    one, eight = np.array(runs[(1, 1)]), np.array(runs[(8, 1)])
    mlm = one[:, 1]
    print(f"\nmegatron-bert tiny mlm loss: first 5 {mlm[:5].mean():.3f}, last 10 {mlm[-10:].mean():.3f}; "
          f"1 vs 8 devices max rel diff {np.abs(eight / one[:15] - 1).max():.1e}")
    assert mlm[-10:].mean() < mlm[:5].mean() - 0.75, mlm  # nats: far beyond step-to-step noise
    assert len(eight) == 15
    np.testing.assert_allclose(eight, one[:15], rtol=2e-4)
    # The trunk is what fine-tuning reads (`FAMILY.trunk`, the shared `Encoder` on the family's config).
    sst2_from(tmp_path / "(1, 1)", tmp_path / "sst2", steps=30, max_seq_length=48, drop=0.3)


@pytest.mark.parametrize("preset", ["tiny", "345m"])
def test_presets_pass_validation(preset):
    c = load_config(preset)
    c.model.vocab_size = c.model.vocab_size or 8192
    validation.check(c)


# --- (d) FLOPs --------------------------------------------------------------------------------------

def test_flops_per_token_is_the_hand_count():
    c = load_config("tiny")
    c.model.vocab_size = v = 8000
    n, h, i, s, p = 2, 128, 512, 128, 20  # layers, width, FFN, sequence, predictions (the tiny recipe)
    assert (c.model.num_layers, c.model.hidden_size, c.model.intermediate_size) == (n, h, i)
    assert (c.data.max_seq_length, c.data.max_predictions_per_seq) == (s, p)
    # Forward multiply-adds x 2 per input token: each layer's key and value projections at every
    # token; its query and output projections, MLP and attention (scores and context over s keys)
    # at every query row, which in the last layer are the p predictions and [CLS] only.
    keys_values = 2 * 2 * h * h
    per_query = 2 * 2 * h * h + 2 * 2 * h * i + 2 * 2 * s * h
    encoder = n * keys_values + (n - 1) * per_query + per_query * (p + 1) / s
    mlm = (2 * h * h + 2 * h * v) * p / s  # transform and the tied output layer, at the predictions
    nsp = (2 * h * h + 2 * h * 2) / s  # pooler and classifier, once per sequence
    assert models.flops_per_token(c) == pytest.approx(3 * (encoder + mlm + nsp), rel=1e-12)  # forward + backward
    # The equal-FLOP sweep's nominal count: the whole stack at every position and the MLM head.
    assert models.flops_per_token(c, nominal=True) == pytest.approx(
        6 * (12 * n * h * h + 2 * n * s * h) + 6 * (h * h + h * v) * p / s, rel=1e-12)


# --- layer_index: layer-wise learning rates and pruning -----------------------------------------------

def test_layer_index_places_every_trunk_parameter():
    c = load_config("tiny")
    c.model.vocab_size = 50
    model = models.build(c.model)
    batch = {k: np.zeros((1, 4), np.int32) for k in ("input_ids", "segment_ids", "masked_positions")}
    params = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0),
                                                             {**batch, "input_mask": np.ones((1, 4), np.int32)})))
    record = models.family("megatron_bert")
    trunk = flatten_dict(record.trunk(params["params"]))
    where = {path: record.layer_index(path) for path in trunk}
    expect = {"embeddings": layout.EMBEDDINGS, "attention_0": 0, "ffn_0": 0, "attention_1": 1, "ffn_1": 1,
              "final_norm": None, "pooler": None}  # the final norm reads the last layer: above the stack
    assert {path: expect[path[0]] for path in trunk} == where
    # Layer-wise decay (ELECTRA's): embeddings decay^(n+2), layer i decay^(n+1-i), the rest the full rate.
    factors = flatten_dict(optimizer.layerwise_multipliers({"encoder": record.trunk(params["params"])}, 2, 0.5,
                                                           record.layer_index))
    assert factors[("encoder", "embeddings", "token", "embedding")] == 0.5 ** 4
    assert factors[("encoder", "attention_0", "norm", "scale")] == 0.5 ** 3  # the norm before layer 0's attention
    assert factors[("encoder", "ffn_1", "norm", "scale")] == 0.5 ** 2
    assert factors[("encoder", "final_norm", "scale")] == 1.0
    # Pruning reaches every layer's kernels and nothing else.
    prunable = {k for k, v in flatten_dict(prune.prunable(params["params"], record.layer_index)).items() if v}
    assert prunable == {("encoder", *k) for k in trunk if k[0][:-1] in ("attention_", "ffn_") and k[-1] == "kernel"}
    assert len(layout.attention_blocks(record.trunk(params["params"]), record.layer_index)) == 2


# --- the released size ---------------------------------------------------------------------------------

def test_345m_preset_is_the_released_shape():
    """The 345m preset builds HF's MegatronBertConfig() network (megatron-bert-cased-345m), tensor
    for tensor, and exports to that config."""
    c = load_config("345m")
    batch = {k: np.zeros((1, 4), np.int32) for k in ("input_ids", "segment_ids", "masked_positions")}
    batch["input_mask"] = np.ones((1, 4), np.int32)
    params = jax.eval_shape(lambda: models.build(c.model).init(jax.random.key(0), batch))["params"]
    ours = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    with torch.device("meta"):
        hf = transformers.MegatronBertForPreTraining(transformers.MegatronBertConfig())
    assert ours == sum(p.numel() for p in hf.parameters())  # the tied output layer counted once on both sides
    print(f"\nmegatron-bert 345m: {ours / 1e6:.1f}M parameters")
    block = c.model.to_dict()
    record = records.for_run(block)
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    default = transformers.MegatronBertConfig()
    shared = [k for k in record.defaults if k in exported and hasattr(default, k)]  # not what transformers 5 dropped
    assert {k: exported[k] for k in shared} == {k: getattr(default, k) for k in shared}
