"""Hugging Face interop: small random HF models of every family, imported and compared output by
output (hidden states of every layer and every head's logits, at real tokens) against
transformers itself, then exported back and reloaded by transformers. Also the one-line errors."""

import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax.traverse_util import flatten_dict  # noqa: E402
from helpers import REPO, max_diff  # noqa: E402

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, import_hf, names, records  # noqa: E402
from bertology.models.transformer import Encoder  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

B, L, V = 3, 12, 97
LENGTHS = (12, 9, 4)
TOLERANCE = 1e-4  # the bar for float32 parity
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=16, hidden_act="gelu")


def _randomize(*hf_models):
    """Random values everywhere (biases and LayerNorms too), so a swapped or missed tensor shows."""
    with torch.no_grad():
        for m in hf_models:
            for p in m.parameters():
                p.normal_(0.0, 0.2)
    return [m.eval() for m in hf_models]


def build_hf(family: str, seed: int = 0) -> dict:
    """HF models by source name, random-init, as a user would have them."""
    torch.manual_seed(seed)
    if family == "bert":
        return {"model": _randomize(transformers.BertForPreTraining(transformers.BertConfig(**SMALL)))[0]}
    if family == "roberta":
        cfg = transformers.RobertaConfig(**{**SMALL, "max_position_embeddings": 18}, type_vocab_size=1,
                                         pad_token_id=1, layer_norm_eps=1e-5)
        return {"model": _randomize(transformers.RobertaForMaskedLM(cfg))[0]}
    if family == "albert":
        # Released ALBERTs use the tanh GELU ("gelu_new"); our model.activation=gelu_tanh reproduces it.
        cfg = transformers.AlbertConfig(**{**SMALL, "num_hidden_layers": 3, "hidden_act": "gelu_new"}, embedding_size=16)
        return {"model": _randomize(transformers.AlbertForPreTraining(cfg))[0]}
    disc_cfg = transformers.ElectraConfig(**{**SMALL, "hidden_size": 64, "intermediate_size": 128}, embedding_size=16)
    gen_cfg = transformers.ElectraConfig(**{**SMALL, "num_attention_heads": 1, "intermediate_size": 128},
                                         embedding_size=16)
    disc, gen = _randomize(transformers.ElectraForPreTraining(disc_cfg), transformers.ElectraForMaskedLM(gen_cfg))
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())  # ELECTRA shares these
    return {"discriminator": disc, "generator": gen}


def make_batch(family: str) -> dict:
    rng = np.random.default_rng(0)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, V, (B, L)), 1 if family == "roberta" else 0).astype(np.int32)
    seg = (np.arange(L)[None] >= np.array(LENGTHS)[:, None] // 2) * mask
    seg = np.zeros_like(seg) if family == "roberta" else seg.astype(np.int32)
    positions = np.broadcast_to(np.arange(L, dtype=np.int32), (B, L))  # the MLM heads at every position
    return dict(input_ids=ids, input_mask=mask, segment_ids=seg, masked_positions=positions)


def hf_outputs(hf_models: dict, batch: dict) -> dict:
    args = {k: torch.tensor(batch[b], dtype=torch.long) for k, b in
            (("input_ids", "input_ids"), ("attention_mask", "input_mask"), ("token_type_ids", "segment_ids"))}
    out = {}
    with torch.no_grad():
        for source, m in hf_models.items():
            o = m(**args, output_hidden_states=True)
            prefix = "generator_" if source == "generator" else ""
            out.update({f"{prefix}hidden_{i}": h for i, h in enumerate(o.hidden_states)})
            for key, name in (("prediction_logits", "mlm"), ("seq_relationship_logits", "nsp"),
                              ("sop_logits", "sop")):
                if key in o:
                    out[name] = o[key]
            if "prediction_logits" not in o:
                out[{"model": "mlm", "generator": "generator_mlm", "discriminator": "discriminator"}[source]] = o.logits
    return {k: v.numpy() for k, v in out.items()}


def our_outputs(family: str, params: dict, model_config: dict, batch: dict) -> dict:
    model = models.build(ml_collections.ConfigDict(model_config))
    cfg = models.encoder_config(model_config)
    trunk = models.family(family).trunk(params)
    enc = Encoder(cfg).apply({"params": trunk}, batch)
    out = {f"hidden_{i}": h for i, h in enumerate(enc["layers"])}
    if family == "electra":
        out["discriminator"] = model.apply({"params": params}, batch, method="discriminate")
        out["generator_mlm"] = model.apply({"params": params}, batch, method="generate")
        gen = model.apply({"params": params}, batch, method=lambda m, b: m.generator.encoder(b))
        out.update({f"generator_hidden_{i}": h for i, h in enumerate(gen["layers"])})
    else:
        res = model.apply({"params": params}, batch)
        out["mlm"] = res["mlm_logits"]
        out.update({k[:-7]: v for k, v in res.items() if k in ("nsp_logits", "sop_logits")})
    return {k: np.asarray(v) for k, v in out.items()}


def _save(hf_models: dict, root) -> dict:
    dirs = {}
    for source, m in hf_models.items():
        dirs[source] = root / f"hf_{source}"
        m.save_pretrained(dirs[source])
    return dirs


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra"])
def test_import_matches_transformers_and_round_trips(family, tmp_path):
    hf_models = build_hf(family)
    batch = make_batch(family)
    dirs = _save(hf_models, tmp_path)
    main = dirs.get("model", dirs.get("discriminator"))
    report = import_hf(main, tmp_path / "run", dirs.get("generator"))
    assert report.family == family and report.fresh == [] and report.unused == []

    params, run_config = load_params(tmp_path / "run")
    rows = names.tensors(records.registry()[family].layout, set(flatten_dict(params)))
    assert {r.ours for r in rows} == set(flatten_dict(params)), "every parameter has a row in the name map"

    reference = hf_outputs(hf_models, batch)
    diffs = max_diff(our_outputs(family, params, run_config["model"], batch), reference, batch["input_mask"])
    print(f"\n{family} max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs)")
    assert max(diffs.values()) <= TOLERANCE, diffs

    exported = export_hf(tmp_path / "run", tmp_path / "export")
    reloaded = {}
    for target in exported:
        source = target.name if family == "electra" else "model"
        cls = type(hf_models[source])
        reloaded[source], info = cls.from_pretrained(target, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    round_trip = max_diff(hf_outputs(reloaded, batch), reference, batch["input_mask"])
    assert max(round_trip.values()) <= 1e-6, round_trip


def test_electra_discriminator_alone_keeps_fresh_generator(tmp_path):
    dirs = _save({"discriminator": build_hf("electra")["discriminator"]}, tmp_path)
    report = import_hf(dirs["discriminator"], tmp_path / "run")
    assert report.fresh and all(name.startswith("generator/") for name in report.fresh)
    params, run_config = load_params(tmp_path / "run")
    assert run_config["model"]["pooler"] is False and "generator" in params


def _hf_bert_dir(tmp_path, **config_edits):
    d = _save(build_hf("bert"), tmp_path)["model"]
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **config_edits}))
    return d


def test_mismatched_checkpoint_names_first_tensor_and_both_shapes(tmp_path):
    d = _hf_bert_dir(tmp_path, intermediate_size=48)
    with pytest.raises(UserError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight has shape "
                                        r"\(64, 32\) but the config builds \(48, 32\)"):
        import_hf(d, tmp_path / "run")


@pytest.mark.parametrize("edit, message", [
    (lambda state: {k: v for k, v in state.items() if k != "bert.encoder.layer.1.output.LayerNorm.bias"},
     "has no tensor bert.encoder.layer.1.output.LayerNorm.bias"),
    (lambda state: {**state, "cls.predictions.decoder.weight": state["bert.embeddings.word_embeddings.weight"] + 1},
     "cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight"),
])
def test_checkpoint_that_does_not_fit_is_refused(edit, message, tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _hf_bert_dir(tmp_path)
    save_file(edit(load_file(d / "model.safetensors")), d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=message):
        import_hf(d, tmp_path / "run")


def test_activation_we_do_not_reproduce_is_refused(tmp_path):
    with pytest.raises(UserError, match="hidden_act='relu' is not reproduced"):
        import_hf(_hf_bert_dir(tmp_path, hidden_act="relu"), tmp_path / "run")


def test_registry_finds_each_family_record_in_its_order():
    """The records come from the family packages (`families/<name>/interop.py`), each package's
    `HF_RECORDS` whole and in its order (export takes a family's first match, so GPT-2 stays before
    OpenAI GPT and T5 before mT5); a new family's record is found without being listed here."""
    found = list(records.registry())
    assert {"bert", "roberta", "albert", "electra", "distilbert", "mobilebert", "gpt2", "openai-gpt", "t5", "mt5",
            "bart", "transfo-xl", "xlnet", "megatron-bert"} <= set(found)
    for path in sorted((REPO / "src" / "bertology" / "families").glob("*/interop.py")):
        module = importlib.import_module(f"bertology.families.{path.parent.name}.interop")
        types = [r.model_type for r in module.HF_RECORDS]
        assert [t for t in found if t in types] == types, path
        assert all(r.family == path.parent.name for r in module.HF_RECORDS), path
    assert found.index("gpt2") < found.index("openai-gpt") and found.index("t5") < found.index("mt5")


def hf_defaults(config, key: str) -> list | None:
    """transformers' values for `key` when config.json omits it: the config class's default, or for
    a key the class does not define, the `getattr(config, "key", default)`s of its modeling code
    (DeBERTa-v2's `position_buckets`; its `conv_kernel_size` has two: 0 where the encoder decides
    whether there is a convolution at all, 3 for the width of one it builds); None if neither has it."""
    if hasattr(config, key):
        return [getattr(config, key)]
    modeling = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    found = re.findall(rf'getattr\(\s*config,\s*"{key}",\s*([^()]+?)\s*\)', inspect.getsource(modeling))
    return [ast.literal_eval(v) for v in found] or None


@pytest.mark.parametrize("model_type", list(records.registry()))
def test_records_agree_with_transformers(model_type):
    """What a record assumes for a key config.json omits is transformers' own default, every HF key
    it reads has one, and the classes it exports are that model type's. A key the installed
    transformers no longer has at all (v5 dropped BERT's relative `position_embedding_type`) must be
    one the record requires: transformers now computes only that value, and import refuses others."""
    record = records.registry()[model_type]
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} (test_interop_xl checks its record)")
    config = transformers.AutoConfig.for_model(model_type)
    hf = {key: hf_defaults(config, key) for key in record.defaults}
    assert {key for key, values in hf.items() if values is None} <= set(record.required)
    def plain(value):  # a sequence as a list: transformers 5 keeps some list defaults as tuples, 4 as lists
        return list(value) if isinstance(value, tuple) else value

    assert {k: v for k, v in record.defaults.items()
            if hf[k] is not None and plain(v) not in [plain(d) for d in hf[k]]} == {}
    read = {key for _, key in record.keys} | ({record.activation[0]} - {None}) | set(record.required)
    assert read <= set(record.defaults), read - set(record.defaults)
    assert all(getattr(transformers, a).config_class.model_type == model_type for a in record.architectures.values())


def test_generator_option_is_refused_for_a_single_checkpoint_type(tmp_path):
    dirs = _save(build_hf("bert"), tmp_path)
    with pytest.raises(UserError, match="--generator applies to electra only, not bert"):
        import_hf(dirs["model"], tmp_path / "run", dirs["model"])


def _convert(*args):
    return subprocess.run([sys.executable, "-m", "bertology.convert", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_cli_import_and_export(tmp_path):
    d = tmp_path / "hf"
    build_hf("bert")["model"].save_pretrained(d, safe_serialization=False)  # the legacy torch pickle
    (d / "vocab.txt").write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"]))
    r = _convert("--from", "hf", "--in", d, "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["vocab"] == str(tmp_path / "run" / "vocab.txt")
    r = _convert("--to", "hf", "--in", tmp_path / "run", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "vocab.txt").read_text() == (d / "vocab.txt").read_text()
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out").tokenize("The the") == ["the", "the"]


def test_export_writes_a_model_card_of_the_run(pretrained, tmp_path):
    """The README.md an export writes is a model card the Hub's tools read (front matter), with the
    run's own numbers: the exported step and its last logged loss; BERT does not generate, so no
    generation_config.json."""
    from huggingface_hub import ModelCard

    from bertology.train.metrics import read_steps

    (out,) = export_hf(pretrained, tmp_path / "out")
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and "bertology" in card.data.tags
    step, last = max(read_steps(pretrained / "metrics.jsonl").items())
    assert step == 3 and f"at step {step}," in card.text and "`BertForPreTraining`" in card.text
    assert f"| `loss` | {json.dumps(last['loss'])} |" in card.text
    assert "| `num_layers` |" in card.text and not (out / "generation_config.json").exists()


def test_sentence_transformers_export_gives_the_features_sentence_vectors(pretrained, tmp_path):
    """A run exported for sentence-transformers (through the CLI) loads as a SentenceTransformer
    whose embeddings are the sentence vectors `bertology.features` computes: the same tokens, the
    same encoder, mean pooling over the real tokens."""
    from sentence_transformers import SentenceTransformer

    from bertology.features import extract

    r = _convert("--to", "sentence-transformers", "--in", pretrained, "--out", tmp_path / "st")
    assert r.returncode == 0 and r.stdout.strip() == f"exported {tmp_path / 'st'}", r.stderr
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    texts = ["the film is a delight", "a dull , lifeless and tedious movie that never ends", "x"]
    theirs = model.encode(texts, convert_to_numpy=True)
    ours = extract(pretrained, texts, max_seq_length=model.max_seq_length)["sentence"]
    hidden = json.loads((pretrained / "config.json").read_text())["model"]["hidden_size"]
    assert model.max_seq_length == 32 and theirs.shape == ours.shape == (3, hidden)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert np.abs(ours[0] - ours[1]).max() > 1e-2  # the sentences' vectors differ: pooling reads the tokens


def test_cli_error_is_one_line(tmp_path):
    r = _convert("--from", "hf", "--in", tmp_path / "missing", "--out", tmp_path / "run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"bertology.convert: error: {tmp_path / 'missing' / 'config.json'} "
                                              "not found; pass a Hugging Face model directory (config.json + weights), or restore the "
                                              "file from the model's release"]
