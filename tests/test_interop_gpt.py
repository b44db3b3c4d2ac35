"""Hugging Face GPT-2 and OpenAI GPT interop: small random HF models imported and compared with
transformers (every hidden state and the logits at every real token of left-padded rows), our
random GPTs exported and loaded by transformers, the tokenizer files both ways, greedy generation
token for token, and the one-line refusals of what we would compute differently."""

import json
import os

import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402
from helpers import max_diff  # noqa: E402

from bertology import models  # noqa: E402
from bertology.data.embedded import BYTE_BPE_VOCAB  # noqa: E402
from bertology.data.tokenizers import load_tokenizer, tokenizer_files  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, import_hf, names, records  # noqa: E402
from bertology.interop.hf import param_shapes, write_run  # noqa: E402
from bertology.models.transformer import Decoder  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

V, L = 97, 12
LENGTHS = (12, 9, 4)
TOLERANCE = 1e-4  # the bar for float32 parity
# Distinct dropouts and epsilon, so a key mapped to the wrong one of ours shows in the block.
SMALL = dict(vocab_size=V, n_positions=32, n_embd=32, n_layer=3, n_head=4, resid_pdrop=0.15, embd_pdrop=0.15,
             attn_pdrop=0.05, layer_norm_epsilon=1e-6)
HF_CLASSES = {
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config, {"n_inner": 48}),
    "openai-gpt": (transformers.OpenAIGPTLMHeadModel, transformers.OpenAIGPTConfig, {}),
}
# The spec of each model type in our terms (GPT-2: Radford et al. 2019's pre-LN and residual init).
EXPECTED = {
    "gpt2": dict(norm="pre", scale_residual_init=True, intermediate_size=48),
    "openai-gpt": dict(norm="post", scale_residual_init=False, intermediate_size=4 * 32),
}
COMMON = dict(family="gpt", activation="gelu_tanh", type_vocab_size=0, embedding_norm=False, pooler=False,
              layer_norm_eps=1e-6, max_position_embeddings=32, dropout_rate=0.15, attention_dropout_rate=0.05,
              hidden_size=32, num_layers=3, num_heads=4, vocab_size=V)
MODEL_TYPES = list(HF_CLASSES)


def build_hf(model_type: str, seed: int = 0, **edits):
    """A random HF LM head model, every parameter (biases and LayerNorms too) drawn from N(0, 0.2)."""
    torch.manual_seed(seed)
    cls, config_cls, extra = HF_CLASSES[model_type]
    model = cls(config_cls(**{**SMALL, **extra, **edits}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def left_padded(vocab: int, seed: int = 0) -> dict:
    """Rows padded on the left as for generation, positions counted from the first real token."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] >= L - np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, vocab, mask.shape), 0).astype(np.int32)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return dict(input_ids=ids, input_mask=mask, positions=positions)


def hf_outputs(model, batch: dict) -> dict:
    """Every hidden state and the logits, with position ids from the mask (as HF generation makes them)."""
    with torch.no_grad():
        o = model(input_ids=torch.tensor(batch["input_ids"]).long(),
                  attention_mask=torch.tensor(batch["input_mask"]).long(),
                  position_ids=torch.tensor(batch["positions"]).long(), output_hidden_states=True)
    return {"logits": o.logits.numpy(), **{f"hidden_{i}": h.numpy() for i, h in enumerate(o.hidden_states)}}


def our_outputs(params: dict, block: dict, batch: dict) -> dict:
    model = models.build(ml_collections.ConfigDict(block))
    trunk = models.family("gpt").trunk(params)
    layers = Decoder(models.encoder_config(block)).apply({"params": trunk}, batch)["layers"]
    logits = model.apply({"params": params}, batch)["logits"]
    return {"logits": np.asarray(logits), **{f"hidden_{i}": np.asarray(h) for i, h in enumerate(layers)}}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_import_matches_transformers(model_type, tmp_path):
    hf_model = build_hf(model_type)
    hf_model.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type, report.fresh, report.unused) == ("gpt", model_type, [], [])

    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert {k: block[k] for k in {**COMMON, **EXPECTED[model_type]}} == {**COMMON, **EXPECTED[model_type]}
    flat = set(flatten_dict(params))
    assert {r.ours for r in names.tensors(records.registry()[model_type].layout, flat)} == flat

    batch = left_padded(V)
    diffs = max_diff(our_outputs(params, block, batch), hf_outputs(hf_model, batch), batch["input_mask"])
    print(f"\n{model_type} max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs)")
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_released_gpt2_layout_imports(tmp_path):
    """The released GPT-2 checkpoint is a bare GPT2Model (names without `transformer.`) that also
    holds each layer's causal-mask buffers; neither may confuse the import."""
    from safetensors.numpy import load_file, save_file

    hf_model = build_hf("gpt2")
    hf_model.transformer.save_pretrained(tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    assert not any(k.startswith("transformer.") for k in state)
    for i in range(SMALL["n_layer"]):
        state[f"h.{i}.attn.bias"] = np.tril(np.ones((32, 32), np.float32))[None, None]
        state[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(state, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert report.fresh == [] and report.unused == []
    params, run_config = load_params(tmp_path / "run")
    batch = left_padded(V)
    diffs = max_diff(our_outputs(params, run_config["model"], batch), hf_outputs(hf_model, batch), batch["input_mask"])
    assert max(diffs.values()) <= TOLERANCE, diffs


def _our_run(model_type: str, workdir, seed: int = 0, **edits) -> tuple[dict, dict]:
    """A random GPT of `model_type`'s shape with the shipped byte-level BPE, written as a run."""
    block = {**COMMON, **EXPECTED[model_type], "vocab_size": load_tokenizer(BYTE_BPE_VOCAB).vocab_size, **edits}
    model = models.build(ml_collections.ConfigDict(block))
    shapes = param_shapes(model)
    rng = np.random.default_rng(seed)
    params = unflatten_dict({k: rng.normal(0.0, 0.2, shape).astype(np.float32) for k, shape in shapes.items()})
    write_run(workdir, block, params, tokenizer_files(BYTE_BPE_VOCAB))
    return block, params


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_export_loads_in_transformers_and_round_trips(model_type, tmp_path):
    block, params = _our_run(model_type, tmp_path / "run")
    (out,) = export_hf(tmp_path / "run", tmp_path / "hf")
    hf_model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(hf_model) is HF_CLASSES[model_type][0]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert hf_model.lm_head.weight.data_ptr() == hf_model.transformer.get_input_embeddings().weight.data_ptr()

    tokenizer = load_tokenizer(BYTE_BPE_VOCAB)
    text = "Return the value of x, or None.\n  Übergrößenträger 東京 <|endoftext|>"
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text)
    assert hf_model.config.eos_token_id == tokenizer.eos_id
    # generate() reads its special tokens from generation_config.json
    assert hf_model.generation_config.eos_token_id == tokenizer.eos_id == json.loads(
        (out / "generation_config.json").read_text())["eos_token_id"]

    vocab_size = block["vocab_size"]
    batch = left_padded(vocab_size)
    diffs = max_diff(our_outputs(params, block, batch), hf_outputs(hf_model.eval(), batch), batch["input_mask"])
    print(f"\n{model_type} export max abs diff in transformers: {max(diffs.values()):.2e}")
    assert max(diffs.values()) <= TOLERANCE, diffs

    report = import_hf(out, tmp_path / "back")
    assert report.vocab == tmp_path / "back" / "vocab.json" and report.fresh == [] and report.unused == []
    back, run_config = load_params(tmp_path / "back")
    assert all(np.array_equal(v, flatten_dict(params)[k]) for k, v in flatten_dict(back).items())
    assert {k: run_config["model"][k] for k in block} == block


def test_tokenizer_files_are_copied_only_when_ours_gives_hf_ids(tmp_path):
    """GPT-2's vocab.json + merges.txt are a byte-level BPE, ours; OpenAI GPT's files of the same
    names hold a lower-cased BPE with word-end markers, which ours would split differently."""
    tokenizer = load_tokenizer(BYTE_BPE_VOCAB)
    for model_type in MODEL_TYPES:
        d = tmp_path / model_type
        build_hf(model_type).save_pretrained(d)
        for f in tokenizer_files(BYTE_BPE_VOCAB):
            (d / f.name).write_bytes(f.read_bytes())
        report = import_hf(d, tmp_path / f"run_{model_type}")
        if model_type == "gpt2":
            assert report.vocab == tmp_path / "run_gpt2" / "vocab.json"
            _, run_config = load_params(tmp_path / "run_gpt2")
            text = "Tokenizers decide the ids; the ids decide the checkpoint."
            ours = load_tokenizer(run_config["data"]["vocab"]).encode(text)
            assert ours == transformers.GPT2Tokenizer.from_pretrained(d)(text)["input_ids"] == tokenizer.encode(text)
        else:
            assert report.vocab is None
            assert json.loads((tmp_path / f"run_{model_type}" / "config.json").read_text())["data"]["vocab"] is None


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_generation_matches_transformers(model_type, tmp_path):
    generation = pytest.importorskip("bertology.generation")
    hf_model = build_hf(model_type)
    hf_model.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "run")
    params, run_config = load_params(tmp_path / "run")
    model = models.build(ml_collections.ConfigDict(run_config["model"]))
    batch, new = left_padded(V), 10
    ours = generation.generate(model, params, batch["input_ids"], batch["input_mask"], max_new_tokens=new,
                               temperature=0.0)
    # Each prompt alone, unpadded: HF's OpenAI GPT ignores the mask when numbering positions.
    for row, ids, mask in zip(ours, batch["input_ids"], batch["input_mask"]):
        prompt = torch.tensor(ids[mask > 0][None]).long()
        with torch.no_grad():
            reference = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                          max_new_tokens=new, pad_token_id=0)
        assert row.tolist() == reference[0, prompt.shape[1]:].tolist()


def _edited_hf_dir(tmp_path, model_type: str, **config_edits):
    d = tmp_path / "hf"
    build_hf(model_type).save_pretrained(d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **config_edits}))
    return d


@pytest.mark.parametrize("model_type, edits, message", [
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True is not reproduced"),
    ("gpt2", dict(reorder_and_upcast_attn=True), "reorder_and_upcast_attn=True is not reproduced"),
    ("gpt2", dict(scale_attn_weights=False), "scale_attn_weights=False is not reproduced"),
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention=True is not reproduced"),
    ("gpt2", dict(tie_word_embeddings=False), "tie_word_embeddings=False is not reproduced"),
    ("openai-gpt", dict(tie_word_embeddings=False), "tie_word_embeddings=False is not reproduced"),
    ("gpt2", dict(activation_function="relu"), "activation_function='relu' is not reproduced"),
    ("openai-gpt", dict(afn="silu"), "afn='silu' is not reproduced"),
    ("gpt2", dict(embd_pdrop=0.3), "embd_pdrop=0.3 differs from resid_pdrop=0.15"),
    ("openai-gpt", dict(embd_pdrop=0.0), "embd_pdrop=0.0 differs from resid_pdrop=0.15"),
    ("gpt2", dict(n_inner=40), r"transformer\.h\.0\.mlp\.c_fc\.weight has shape \(32, 48\) but the config builds "
                               r"\(32, 40\)"),
])
def test_what_we_would_compute_differently_is_refused(model_type, edits, message, tmp_path):
    with pytest.raises(UserError, match=message):
        import_hf(_edited_hf_dir(tmp_path, model_type, **edits), tmp_path / "run")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_untied_output_layer_is_refused(model_type, tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _edited_hf_dir(tmp_path, model_type)
    record = records.registry()[model_type]
    (head, table), = record.tied.items()
    state = load_file(d / "model.safetensors")
    save_file({**state, head: state[table] + 1}, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"{head} differs from {table}; untied output layers are not supported"):
        import_hf(d, tmp_path / "run")


@pytest.mark.parametrize("model_type, edits, message", [
    ("gpt2", dict(use_bias=False), r"no Hugging Face model type computes this gpt model: gpt2 needs "
                                   r"model\.use_bias=True \(not False\); openai-gpt needs model\.norm='post'"),
    ("gpt2", dict(positions="relative_bias"), "gpt2 needs model.positions='absolute'"),
    ("gpt2", dict(activation="relu"), "gpt2 has no activation_function computing model.activation='relu'"),
    ("openai-gpt", dict(activation="gelu"), "openai-gpt has no afn computing model.activation='gelu'"),
    ("openai-gpt", dict(intermediate_size=48), "openai-gpt's feed-forward width is 4·hidden = 128; "
                                               "model.intermediate_size=48 has no openai-gpt counterpart"),
    ("gpt2", dict(embedding_norm=True), "gpt2 needs model.embedding_norm=False"),
])
def test_export_refuses_a_model_no_hf_type_computes(model_type, edits, message, tmp_path):
    _our_run(model_type, tmp_path / "run", **edits)
    with pytest.raises(UserError, match=message):
        export_hf(tmp_path / "run", tmp_path / "hf")


def test_fused_rows_split_and_join_the_hf_tensor():
    """c_attn's [H, 3H] is query, key and value side by side; each of ours is [H, heads, head_dim]."""
    shapes = {("decoder", "attention_0", n, leaf): s for n in ("query", "key", "value")
              for leaf, s in (("kernel", (8, 2, 4)), ("bias", (2, 4)))}
    rows = names.tensors(records.registry()["gpt2"].layout, shapes)
    assert {r.hf for r in rows} == {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias"}
    rng = np.random.default_rng(0)
    ours = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    state = names.export_state(rows, ours, shapes, "test")["model"]
    weight = state["transformer.h.0.attn.c_attn.weight"]
    expected = np.concatenate([ours["decoder", "attention_0", n, "kernel"].reshape(8, 8)
                               for n in ("query", "key", "value")], axis=1)
    np.testing.assert_array_equal(weight, expected)
    for r in rows:
        np.testing.assert_array_equal(r.to_ours(state[r.hf], shapes[r.ours]), ours[r.ours])


# ---------------------------------------------------------------- fine-tuning: the causal trunk

SEQUENCE_CLASSIFICATION = {"gpt2": transformers.GPT2ForSequenceClassification,
                           "openai-gpt": transformers.OpenAIGPTForSequenceClassification}


def right_padded(vocab: int, seed: int = 0) -> dict:
    """Rows padded on the right as `bertology.tasks` builds them; real ids never the pad id 0."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, vocab, mask.shape), 0).astype(np.int32)
    return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids))


DOUBLE_HEADS = {"gpt2": transformers.GPT2DoubleHeadsModel, "openai-gpt": transformers.OpenAIGPTDoubleHeadsModel}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_multiple_choice_matches_the_double_heads_model(model_type, tmp_path):
    """`GPT2DoubleHeadsModel` / `OpenAIGPTDoubleHeadsModel`'s multiple-choice logits (GPT-1's
    SWAG-style input: each choice its own causal row, a linear unit with a bias on the state of
    the token `mc_token_ids` points at, a softmax over the choices) against our choice head on the
    imported trunk, with `mc_token_ids` at each row's last real token as our trunk reads it."""
    from bertology.models.tasks import TaskModel

    _, config_cls, extra = HF_CLASSES[model_type]
    torch.manual_seed(5)
    hf_model = DOUBLE_HEADS[model_type](config_cls(**{**SMALL, **extra}, pad_token_id=0))
    with torch.no_grad():
        for p in hf_model.parameters():
            p.normal_(0.0, 0.2)
        hf_model.multiple_choice_head.summary.weight.mul_(20.0)  # GPT-1's post-LN states barely differ: spread the scores
    hf_model.eval().save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert sorted(u.rsplit(": ", 1)[1] for u in report.unused) == [
        "multiple_choice_head.summary.bias", "multiple_choice_head.summary.weight"]  # the head: ours below
    params, run_config = load_params(tmp_path / "run")
    cfg, trunk = models.pretrained_encoder(params, run_config["model"])
    model = TaskModel(cfg, "choice", 1, "full", "gpt")
    summary = hf_model.multiple_choice_head.summary
    head = {"kernel": jnp.asarray(summary.weight.detach().numpy().T), "bias": jnp.asarray(summary.bias.detach().numpy())}
    rows = [right_padded(V, seed=6 + c) for c in range(2)]  # 3 examples × 2 choices, lengths 12, 9, 4
    batch = {k: np.stack([r[k] for r in rows], axis=1) for k in rows[0]}  # [batch, choices, length]
    last = batch["input_mask"].sum(-1) - 1
    with torch.no_grad():
        # no attention_mask: the padding follows the last real token, which causal attention never
        # lets it see (and OpenAIGPTModel cannot take a [batch, choices, length] mask)
        want = hf_model(input_ids=torch.tensor(batch["input_ids"]).long(),
                        mc_token_ids=torch.tensor(last).long()).mc_logits.numpy()
    got = np.asarray(model.apply({"params": {"encoder": trunk, "head": head}}, batch)["logits"])
    print(f"\n{model_type} multiple choice: max logit diff {np.abs(got - want).max():.2e}")
    assert got.shape == want.shape == (3, 2)
    assert np.abs(got - want).max() <= TOLERANCE
    assert np.abs(want[:, 0] - want[:, 1]).min() > 1e-3  # the choices differ, so one constant score would fail


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_sequence_classification_matches_transformers(model_type, tmp_path):
    """`GPT2ForSequenceClassification` / `OpenAIGPTForSequenceClassification` (a bias-free score
    layer at the last non-padding token) against our task model on the imported weights: the
    trunk runs causally and the head reads each row's last real token (Radford et al. 2018)."""
    from bertology.models.tasks import TaskModel

    _, config_cls, extra = HF_CLASSES[model_type]
    hf_model = SEQUENCE_CLASSIFICATION[model_type](config_cls(**{**SMALL, **extra}, num_labels=3, pad_token_id=0))
    # Seeded after construction: transformers 5 initialises with other draws than 4.x did, and
    # the weights drawn below should not depend on it.
    torch.manual_seed(3)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.normal_(0.0, 0.2)
        hf_model.score.weight.mul_(20.0)  # GPT-1's post-LN states barely differ: spread the scores
    hf_model.eval().save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert [u.rsplit(": ", 1)[1] for u in report.unused] == ["score.weight"]  # the task layer: ours is the head below
    params, run_config = load_params(tmp_path / "run")
    cfg, trunk = models.pretrained_encoder(params, run_config["model"])
    model = TaskModel(cfg, "classification", 3, "full", "gpt")
    head = {"kernel": jnp.asarray(hf_model.score.weight.detach().numpy().T), "bias": jnp.zeros(3)}
    batch = right_padded(V, seed=4)
    with torch.no_grad():
        want = hf_model(input_ids=torch.tensor(batch["input_ids"]).long(),
                        attention_mask=torch.tensor(batch["input_mask"]).long()).logits.numpy()
    got = np.asarray(model.apply({"params": {"encoder": trunk, "head": head}}, batch)["logits"])
    print(f"\n{model_type} sequence classification: max logit diff {np.abs(got - want).max():.2e}")
    assert np.abs(got - want).max() <= TOLERANCE
    assert np.abs(want[0] - want[1]).max() > 1e-2  # the rows differ, so a constant output would fail
    # causal: a token after a row's last real one (padding) changes nothing; the first token changes the logits
    later, earlier = dict(batch), dict(batch)
    later["input_ids"] = np.where(batch["input_mask"] > 0, batch["input_ids"], 5).astype(np.int32)
    earlier["input_ids"] = batch["input_ids"].copy()
    earlier["input_ids"][:, 0] = batch["input_ids"][:, 0] % (V - 1) + 1
    apply = lambda b: np.asarray(model.apply({"params": {"encoder": trunk, "head": head}}, b)["logits"])  # noqa: E731
    np.testing.assert_allclose(apply(later), got, atol=1e-6)
    assert np.abs(apply(earlier) - got).max(axis=1).min() > 1e-4  # every row's last token reads its first
