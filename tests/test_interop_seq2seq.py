"""Hugging Face T5 (v1.0 and v1.1 shapes), mT5 and BART interop: small random torch models built
from configs (nothing downloaded) imported and compared with transformers at every decoder
position, with padding in both the source and the target; our random models exported, loaded by
transformers with no missing or unexpected keys, and giving the same logits; decoding with the KV
cache on the converted models equal to teacher forcing; and the refusals of what we would compute
differently."""

import json
import os

import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, families, import_hf, names  # noqa: E402
from bertology.interop.hf import param_shapes, write_run  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

V, B, LS, LT = 71, 3, 9, 7
SOURCE_LENGTHS, TARGET_LENGTHS = (9, 6, 3), (7, 5, 2)
TOLERANCE = 1e-4  # the bar for float32 parity
# d_kv differs from d_model / num_heads (as in mT5-small: 512, 6 heads of 64), few buckets so that
# offsets beyond the exact range and beyond max_distance both occur within 9 tokens.
T5_SMALL = dict(vocab_size=V, d_model=24, d_kv=10, num_heads=3, d_ff=40, num_layers=2,
                relative_attention_num_buckets=8, relative_attention_max_distance=6, dropout_rate=0.15,
                layer_norm_epsilon=1e-5)
HF = {  # name: (class, config class, config)
    "t5_v1_0": (transformers.T5ForConditionalGeneration, transformers.T5Config,
                dict(T5_SMALL, feed_forward_proj="relu", tie_word_embeddings=True)),
    "t5_v1_1": (transformers.T5ForConditionalGeneration, transformers.T5Config,
                dict(T5_SMALL, feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    "mt5": (transformers.MT5ForConditionalGeneration, transformers.MT5Config, T5_SMALL),
    "bart": (transformers.BartForConditionalGeneration, transformers.BartConfig,
             dict(vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=20,
                  dropout=0.15, attention_dropout=0.05, activation_dropout=0.1, scale_embedding=True)),
}
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


def build_hf(name: str, seed: int = 0, **edits):
    """A random HF model, every parameter (and BART's output bias buffer) drawn from N(0, 0.3)."""
    torch.manual_seed(seed)
    cls, config_cls, config = HF[name]
    model = cls(config_cls(**{**config, **edits}, attn_implementation="eager"))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.3)
    return model.eval()


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
    flat = set(flatten_dict(params))
    assert {r.ours for r in names.tensors(families.RECORDS[MODEL_TYPE[name]].layout, flat)} == flat

    batch = padded_batch()
    ours, reference = our_logits(params, block, batch), hf_logits(hf_model, batch)
    diff = float(np.abs(ours - reference).max())  # every position, padded ones included
    print(f"\n{name} import: max abs logit diff vs transformers {diff:.2e}")
    assert diff <= TOLERANCE
    # and the KV-cached incremental decoding of the converted model equals teacher forcing
    np.testing.assert_allclose(cached_logits(params, block, batch), ours, atol=1e-5)


def _our_run(name: str, workdir, seed: int = 0) -> tuple[dict, dict]:
    """A random model of `name`'s shape, written as a run directory."""
    block = EXPECTED[name]
    shapes = param_shapes(our_model(block))
    rng = np.random.default_rng(seed)
    params = unflatten_dict({k: rng.normal(0.0, 0.3, shape).astype(np.float32) for k, shape in shapes.items()})
    write_run(workdir, block, params)
    return block, params


@pytest.mark.parametrize("name", ["t5_v1_0", "t5_v1_1", "bart"])
def test_export_loads_in_transformers_and_round_trips(name, tmp_path):
    block, params = _our_run(name, tmp_path / "run")
    (out,) = export_hf(tmp_path / "run", tmp_path / "hf")
    hf_model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, output_loading_info=True)
    assert type(hf_model) is HF[name][0]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert hf_model.config.tie_word_embeddings == block.get("tie_embeddings", True)

    batch = padded_batch(1)
    diff = float(np.abs(our_logits(params, block, batch) - hf_logits(hf_model.eval(), batch)).max())
    print(f"\n{name} export: max abs logit diff in transformers {diff:.2e}")
    assert diff <= TOLERANCE

    report = import_hf(out, tmp_path / "back")
    assert report.fresh == [] and report.unused == []
    back, run_config = load_params(tmp_path / "back")
    assert all(np.array_equal(v, flatten_dict(params)[k]) for k, v in flatten_dict(back).items())
    assert {k: run_config["model"][k] for k in block} == block


def _edited_hf_dir(tmp_path, name: str, **config_edits):
    d = tmp_path / "hf"
    build_hf(name).save_pretrained(d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **config_edits}))
    return d


@pytest.mark.parametrize("name, edits, message", [
    ("t5_v1_0", dict(feed_forward_proj="gated-relu"), "feed_forward_proj='gated-relu' is not reproduced"),
    ("t5_v1_1", dict(dense_act_fn="gelu"), "dense_act_fn='gelu' with feed_forward_proj='gated-gelu' is not reproduced"),
    ("t5_v1_0", dict(num_decoder_layers=3), "num_decoder_layers=3 differs from num_layers=2"),
    ("bart", dict(decoder_ffn_dim=32), "decoder_ffn_dim=32 differs from encoder_ffn_dim=24"),
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
