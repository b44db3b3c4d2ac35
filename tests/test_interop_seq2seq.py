"""Hugging Face T5 (v1.0 and v1.1 shapes), mT5 and BART interop: small random torch models built
from configs (nothing downloaded) imported and compared with transformers at every decoder
position, with padding in both the source and the target; our random models exported, loaded by
transformers with no missing or unexpected keys, and giving the same logits; decoding with the KV
cache on the converted models equal to teacher forcing; decoders shallower or deeper than their
encoders (T5's num_decoder_layers, BART's decoder_layers: DistilBART, T5-efficient) both ways, and
their greedy and beam decoding against transformers' generate; and the refusals of what we would
compute differently."""

import json
import os

import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402
from helpers import (  # noqa: E402
    BEAM_SOURCE_LENGTHS,
    HF_SEQ2SEQ_VOCAB,
    NEW,
    START,
    build_hf,
    hf_generate,
    hf_seq2seq_models,
    until_eos,
)

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, import_hf, names, records  # noqa: E402
from bertology.interop.hf import param_shapes, write_run  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

V, B, LS, LT = HF_SEQ2SEQ_VOCAB, 3, 9, 7
SOURCE_LENGTHS, TARGET_LENGTHS = (9, 6, 3), (7, 5, 2)
TOLERANCE = 1e-4  # the bar for float32 parity
HF = hf_seq2seq_models()  # name: (class, config class, config)
# Each checkpoint in our terms (the papers' settings: T5's pre-LN RMSNorm without biases or
# score scaling, relative buckets, tied v1.0 / untied gated v1.1; BART's post-LN learned
# positions counted from 2, embedding LayerNorm, LayerNorm eps 1e-5).
T5_BLOCK = dict(family="t5", vocab_size=V, hidden_size=24, head_size=10, num_heads=3, intermediate_size=40,
                num_layers=2, relative_buckets=8, relative_max_distance=6, dropout_rate=0.15,
                attention_dropout_rate=0.15, activation_dropout_rate=0.15, layer_norm_eps=1e-5, norm="pre", norm_kind="rmsnorm", use_bias=False,
                positions="relative_bias", scale_attention=False, embedding_norm=False, type_vocab_size=0)
EXPECTED = {
    "t5_v1_0": dict(T5_BLOCK, activation="relu", tie_embeddings=True),
    "t5_v1_1": dict(T5_BLOCK, activation="gated_gelu", tie_embeddings=False),
    "mt5": dict(T5_BLOCK, activation="gated_gelu", tie_embeddings=False),
    "bart": dict(family="bart", vocab_size=V, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                 max_position_embeddings=22, position_offset=2, dropout_rate=0.15, attention_dropout_rate=0.05,
                 activation_dropout_rate=0.1, scale_embeddings=True, norm="post", embedding_norm=True,
                 activation="gelu", layer_norm_eps=1e-5, type_vocab_size=0),
}
MODEL_TYPE = {"t5_v1_0": "t5", "t5_v1_1": "t5", "mt5": "mt5", "bart": "bart"}
DECODER_DEPTH = {"t5_v1_0": "num_decoder_layers", "t5_v1_1": "num_decoder_layers", "mt5": "num_decoder_layers",
                 "bart": "decoder_layers"}  # the HF key of the decoder's depth (the encoder's: num_layers)
# (name, decoder depth) of the encoder-decoders of 2 encoder layers with a decoder of another depth
UNEVEN = [("t5_v1_0", 1), ("t5_v1_1", 3), ("bart", 1), ("bart", 3)]


def padded_batch(seed: int = 0) -> dict:
    """Right-padded sources and targets of different lengths (ids 0 at padding)."""
    rng = np.random.default_rng(seed)
    source_mask = (np.arange(LS)[None] < np.array(SOURCE_LENGTHS)[:, None]).astype(np.int32)
    target_mask = (np.arange(LT)[None] < np.array(TARGET_LENGTHS)[:, None]).astype(np.int32)
    return dict(input_ids=(rng.integers(3, V, (B, LS)) * source_mask).astype(np.int32), input_mask=source_mask,
                decoder_input_ids=(rng.integers(3, V, (B, LT)) * target_mask).astype(np.int32),
                decoder_input_mask=target_mask)


def hf_logits(model, batch: dict) -> np.ndarray:
    t = {k: torch.tensor(v).long() for k, v in batch.items()}
    with torch.no_grad():
        return model(input_ids=t["input_ids"], attention_mask=t["input_mask"],
                     decoder_input_ids=t["decoder_input_ids"], decoder_attention_mask=t["decoder_input_mask"]).logits.numpy()


def our_model(block: dict):
    return models.build(ml_collections.ConfigDict(block))


def our_logits(params: dict, block: dict, batch: dict) -> np.ndarray:
    return np.asarray(our_model(block).apply({"params": params}, batch)["logits"])


def cached_logits(params: dict, block: dict, batch: dict) -> np.ndarray:
    """Logits fed one target token at a time against the KV cache, after a cache-creating call
    with the full source and a decoder input of the full target length."""
    model = our_model(block)
    _, variables = model.apply({"params": params}, batch, decode=True, mutable=["cache"])
    cache, steps = variables["cache"], []
    for t in range(LT):
        step = {"decoder_input_ids": batch["decoder_input_ids"][:, t:t + 1],
                "decoder_input_mask": batch["decoder_input_mask"][:, t:t + 1],
                "decoder_positions": np.full((B, 1), t, np.int32)}
        out, variables = model.apply({"params": params, "cache": cache}, step, decode=True, mutable=["cache"])
        cache = variables["cache"]
        steps.append(np.asarray(out["logits"]))
    return np.concatenate(steps, axis=1)


@pytest.mark.parametrize("name", list(HF))
def test_import_matches_transformers_at_every_decoder_position(name, tmp_path):
    hf_model = build_hf(name)
    hf_model.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type, report.fresh, report.unused) == (
        EXPECTED[name]["family"], MODEL_TYPE[name], [], [])

    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert {k: block[k] for k in EXPECTED[name]} == EXPECTED[name]
    assert "num_decoder_layers" not in block  # equal depths import as they always did
    flat = set(flatten_dict(params))
    assert {r.ours for r in names.tensors(records.registry()[MODEL_TYPE[name]].layout, flat)} == flat

    batch = padded_batch()
    ours, reference = our_logits(params, block, batch), hf_logits(hf_model, batch)
    diff = float(np.abs(ours - reference).max())  # every position, padded ones included
    print(f"\n{name} import: max abs logit diff vs transformers {diff:.2e}")
    assert diff <= TOLERANCE
    # and the KV-cached incremental decoding of the converted model equals teacher forcing
    np.testing.assert_allclose(cached_logits(params, block, batch), ours, atol=1e-5)


def _our_run(name: str, workdir, seed: int = 0, **edits) -> tuple[dict, dict]:
    """A random model of `name`'s shape (with `edits` to its model block), written as a run directory."""
    block = {**EXPECTED[name], **edits}
    shapes = param_shapes(our_model(block))
    rng = np.random.default_rng(seed)
    params = unflatten_dict({k: rng.normal(0.0, 0.3, shape).astype(np.float32) for k, shape in shapes.items()})
    write_run(workdir, block, params)
    return block, params


def _export_and_round_trip(block: dict, params: dict, tmp_path, label: str):
    """Export the run in `tmp_path / "run"` and check it both ways: transformers loads every
    tensor and gives our logits, and importing the export back gives the same parameters and
    model block. Returns (the export's directory, the loaded HF model)."""
    (out,) = export_hf(tmp_path / "run", tmp_path / "hf")
    hf_model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info

    batch = padded_batch(1)
    diff = float(np.abs(our_logits(params, block, batch) - hf_logits(hf_model.eval(), batch)).max())
    print(f"\n{label} export: max abs logit diff in transformers {diff:.2e}")
    assert diff <= TOLERANCE

    report = import_hf(out, tmp_path / "back")
    assert report.fresh == [] and report.unused == []
    back, run_config = load_params(tmp_path / "back")
    assert flatten_dict(back).keys() == flatten_dict(params).keys()
    assert all(np.array_equal(v, flatten_dict(params)[k]) for k, v in flatten_dict(back).items())
    assert {k: run_config["model"][k] for k in block} == block
    return out, hf_model


@pytest.mark.parametrize("name", ["t5_v1_0", "t5_v1_1", "bart"])
def test_export_loads_in_transformers_and_round_trips(name, tmp_path):
    block, params = _our_run(name, tmp_path / "run")
    out, hf_model = _export_and_round_trip(block, params, tmp_path, name)
    assert type(hf_model) is HF[name][0]
    # what our tie_embeddings switches: the scaling (transformers 5's own key for it, else the tying)
    config = hf_model.config
    assert getattr(config, "scale_decoder_outputs", config.tie_word_embeddings) == block.get("tie_embeddings", True)
    assert json.loads((out / "config.json").read_text())[DECODER_DEPTH[name]] == block["num_layers"]


def _depths(params: dict) -> tuple[int, int]:
    """(encoder layers, decoder layers) of our parameters: their `attention_{i}` blocks."""
    return tuple(sum(k.startswith("attention_") for k in params[s]) for s in ("encoder", "decoder"))


@pytest.mark.parametrize("name, depth", UNEVEN)
def test_uneven_depths_import_and_match_transformers(name, depth, tmp_path):
    hf_model = build_hf(name, **{DECODER_DEPTH[name]: depth})
    assert len(hf_model.get_encoder().block if name.startswith("t5") else hf_model.get_encoder().layers) == 2
    assert len(hf_model.get_decoder().block if name.startswith("t5") else hf_model.get_decoder().layers) == depth
    hf_model.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.fresh, report.unused) == ([], [])

    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert {k: block[k] for k in EXPECTED[name]} == EXPECTED[name] and block["num_decoder_layers"] == depth
    assert _depths(params) == (2, depth)

    batch = padded_batch()
    ours, reference = our_logits(params, block, batch), hf_logits(hf_model, batch)
    diff = float(np.abs(ours - reference).max())
    print(f"\n{name} 2/{depth} import: max abs logit diff vs transformers {diff:.2e}")
    assert diff <= TOLERANCE
    np.testing.assert_allclose(cached_logits(params, block, batch), ours, atol=1e-5)


@pytest.mark.parametrize("name, written", [
    ("t5_v1_1", {"tie_word_embeddings": True, "scale_decoder_outputs": False}),
    ("mt5", {"tie_word_embeddings": True, "transformers_version": "5.23.0"})])
def test_a_transformers_5_checkpoint_without_lm_head_imports_as_untied(name, written, tmp_path):
    """transformers 5 saves a T5 v1.1 or mT5 it built itself with its output layer tied and not
    written, and a config.json whose `tie_word_embeddings` is true without meaning T5 v1.0's
    scaling. Such a checkpoint imports as the same untied run as one whose lm_head is the token
    table (in the form both lines write)."""
    from safetensors.numpy import load_file, save_file

    build_hf(name).save_pretrained(tmp_path / "hf", safe_serialization=True)
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    tensors["lm_head.weight"] = tensors["shared.weight"]
    save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=False)))
    import_hf(tmp_path / "hf", tmp_path / "reference")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    config = {k: v for k, v in config.items() if k != "scale_decoder_outputs"}
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **written}))
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.fresh, report.unused) == ([], [])
    (got, got_config), (want, want_config) = load_params(tmp_path / "run"), load_params(tmp_path / "reference")
    assert got_config["model"] == want_config["model"] and got_config["model"]["tie_embeddings"] is False
    assert flatten_dict(got).keys() == flatten_dict(want).keys()
    assert all(np.array_equal(v, flatten_dict(want)[k]) for k, v in flatten_dict(got).items())


@pytest.mark.parametrize("name, depth", UNEVEN)
def test_uneven_depths_export_and_round_trip(name, depth, tmp_path):
    block, params = _our_run(name, tmp_path / "run", num_decoder_layers=depth)
    assert _depths(params) == (2, depth)
    out, hf_model = _export_and_round_trip(block, params, tmp_path, f"{name} 2/{depth}")
    written = json.loads((out / "config.json").read_text())
    assert (written["num_layers" if name.startswith("t5") else "encoder_layers"], written[DECODER_DEPTH[name]]) == (
        2, depth)
    assert len(hf_model.get_decoder().block if name.startswith("t5") else hf_model.get_decoder().layers) == depth


@pytest.mark.parametrize("name, depth", [("t5_v1_1", 1), ("bart", 3)])
def test_uneven_depths_decode_as_transformers_generate(name, depth, tmp_path):
    """Greedy and beam-search tokens (and beam scores) of a converted uneven model equal
    transformers' `generate` on the HF model (test_beam's settings and helpers)."""
    from bertology.generation import beam_search, generate

    ROWS = BEAM_SOURCE_LENGTHS

    hf = build_hf(name, seed=1, **{DECODER_DEPTH[name]: depth})
    hf.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "run")
    params, config = load_params(tmp_path / "run")
    model = models.build(config["model"])
    assert _depths(params) == (2, depth)
    mask = (np.arange(max(ROWS))[None] < np.array(ROWS)[:, None]).astype(np.int32)
    ids = (np.random.default_rng(0).integers(3, V, mask.shape) * mask).astype(np.int32)
    greedy = generate(model, params, ids, mask, max_new_tokens=NEW, decoder_start_id=START[name])
    eos = int(np.bincount(greedy[:, 1:].ravel()).argmax())  # an id the model emits, so some rows end early

    ours = generate(model, params, ids, mask, max_new_tokens=NEW, decoder_start_id=START[name], eos_id=eos)
    theirs = hf_generate(hf, (ids, mask), eos, START[name], num_beams=1).sequences.numpy()[:, 1:]
    assert [until_eos(r, eos) for r in ours] == [until_eos(r, eos) for r in theirs]

    beams = beam_search(model, params, ids, mask, num_beams=3, max_new_tokens=NEW, eos_id=eos,
                        decoder_start_id=START[name])
    out = hf_generate(hf, (ids, mask), eos, START[name], num_beams=3, num_return_sequences=3)
    theirs = out.sequences.numpy()[:, 1:].reshape(len(ROWS), 3, -1)
    assert [[until_eos(h, eos) for h in row] for row in beams.tokens] == [[until_eos(h, eos) for h in row]
                                                                          for row in theirs]
    np.testing.assert_allclose(beams.scores, out.sequences_scores.numpy().reshape(len(ROWS), 3), rtol=1e-5, atol=1e-5)


def _edited_hf_dir(tmp_path, name: str, **config_edits):
    d = tmp_path / "hf"
    build_hf(name).save_pretrained(d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **config_edits}))
    return d


@pytest.mark.parametrize("name, edits, message", [
    ("t5_v1_0", dict(feed_forward_proj="gated-relu"), "feed_forward_proj='gated-relu' is not reproduced"),
    ("t5_v1_1", dict(dense_act_fn="gelu"), "dense_act_fn='gelu' with feed_forward_proj='gated-gelu' is not reproduced"),
    ("t5_v1_0", dict(num_decoder_layers=3), r"has no tensor decoder\.block\.2\..*its weights do not fit its config"),
    ("bart", dict(decoder_ffn_dim=32), "decoder_ffn_dim=32 differs from encoder_ffn_dim=24"),
    ("bart", dict(decoder_attention_heads=4), "decoder_attention_heads=4 differs from encoder_attention_heads=2"),
    ("bart", dict(encoder_layerdrop=0.1), "encoder_layerdrop=0.1 is not reproduced"),
    ("bart", dict(activation_function="silu"), "activation_function='silu' is not reproduced"),
])
def test_what_we_would_compute_differently_is_refused(name, edits, message, tmp_path):
    with pytest.raises(UserError, match=message):
        import_hf(_edited_hf_dir(tmp_path, name, **edits), tmp_path / "run")


@pytest.mark.parametrize("name, edits, message", [
    ("t5_v1_0", dict(attention_dropout_rate=0.0), "t5 has one dropout rate"),
    ("t5_v1_0", dict(activation_dropout_rate=0.0), "model.activation_dropout_rate=0.0 must equal"),
    ("t5_v1_0", dict(norm="post"), r"t5 needs model\.norm='pre' \(not 'post'\)"),
    ("bart", dict(position_offset=0), "bart counts positions from 2"),
])
def test_export_refuses_a_model_no_hf_type_computes(name, edits, message, tmp_path):
    block = {**EXPECTED[name], **edits}
    shapes = param_shapes(our_model(block))
    write_run(tmp_path / "run", block, unflatten_dict({k: np.zeros(s, np.float32) for k, s in shapes.items()}))
    with pytest.raises(UserError, match=message):
        export_hf(tmp_path / "run", tmp_path / "hf")
