"""Hugging Face Transformer-XL and XLNet interop: small random HF models imported and compared with
transformers over two segments with the memory carried (XLNet with perm_mask, target_mapping,
segments and left padding), and our models exported and loaded by transformers with no missing
or unexpected keys, then compared again.

Settings covered: Transformer-XL with untied and shared r_w/r_r biases, `clamp_len` below the
distances used and `same_length`; XLNet with `reuse_len` < segment, `mem_len` < reuse + memory,
`clamp_len`, and `bi_data` on and off (HF XLNet always unties its biases).
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax.traverse_util import flatten_dict  # noqa: E402
from helpers import FIXTURES  # noqa: E402

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, import_hf, names, records  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

V, B, L = 61, 4, 8
TOLERANCE = 1e-4


def randomize(model, std: float = 0.2):
    """Every parameter drawn from N(0, std), biases and norms too, so a misplaced tensor shows."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model.eval()


def ours(workdir):
    params, run_config = load_params(workdir)
    return models.build(ml_collections.ConfigDict(run_config["model"])), params, run_config["model"]


def complete_mapping(record, params) -> None:
    flat = set(flatten_dict(params))
    assert {r.ours for r in names.tensors(record.layout, flat)} == flat


# ---------------------------------------------------------------- Transformer-XL

def transfo_xl(untie_r: bool, seed: int = 0):
    from transformers.models.deprecated.transfo_xl import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(seed)
    cfg = TransfoXLConfig(vocab_size=V, cutoffs=[], div_val=1, d_model=16, d_embed=16, n_head=2, d_head=8,
                          d_inner=24, n_layer=2, mem_len=6, clamp_len=5, same_length=True, untie_r=untie_r,
                          dropout=0.0, dropatt=0.0, layer_norm_epsilon=1e-5)
    return randomize(TransfoXLLMHeadModel(cfg), 0.15)


def hf_txl_segments(model, segments):
    """Log-probabilities per segment, HF's own memory carried (its first memory: zero states)."""
    mems, out = None, []
    with torch.no_grad():
        for ids in segments:
            o = model(input_ids=torch.tensor(ids).long(), mems=mems)
            out.append(o.prediction_scores.numpy())
            mems = o.mems
    return out


def our_txl_segments(model, params, block, segments, carry):
    out = []
    for ids in segments:
        o = model.apply({"params": params}, {"input_ids": jnp.asarray(ids), "input_mask": jnp.ones(ids.shape, jnp.int32),
                                             "carry": carry})
        out.append(np.asarray(o["logits"] - jnp.max(o["logits"], -1, keepdims=True)))
        out[-1] = out[-1] - np.log(np.exp(out[-1]).sum(-1, keepdims=True))
        carry = o["carry"]
    return out


def hf_start(block):
    """HF TransfoXL's first memory: zero states that are visible (ours would be empty)."""
    carry = models.family("transfo_xl").initial_carry(block, B)
    return {**carry, "memory_mask": jnp.ones_like(carry["memory_mask"])}


def has_transfo_xl() -> bool:
    return "transfo-xl" in transformers.CONFIG_MAPPING  # transformers 5 removed the deprecated TransfoXL


def make_transfo_xl_runnable(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 4.57.6's deprecated TransfoXL calls `arange(...).type_as(dtype=...)`, which torch
    rejects (`other` is required), so its forward fails as shipped; give that one call the meaning
    it intends (a cast to `dtype`) and leave every other `type_as` alone."""
    original = torch.Tensor.type_as

    def type_as(self, other=None, dtype=None):
        return self.to(dtype) if other is None else original(self, other)

    monkeypatch.setattr(torch.Tensor, "type_as", type_as)


@pytest.fixture
def runnable_transfo_xl(monkeypatch):
    make_transfo_xl_runnable(monkeypatch)


def transfo_xl_reference(untie_r: bool):
    """(checkpoint directory, segments, HF's log-probabilities per segment) of the small random
    TransfoXL that `record_transfo_xl_references` saved with transformers 4.57: transformers 5 has
    no TransfoXL, so where it is installed the recorded outputs stand in for the live model."""
    directory = FIXTURES / "transfo_xl" / f"untie_r_{str(untie_r).lower()}"
    recorded = np.load(directory / "reference.npz")
    return directory / "hf", list(recorded["segments"]), list(recorded["log_probs"])


def record_transfo_xl_references() -> None:
    """Writes tests/fixtures/transfo_xl (run this file as a script where transformers < 5 is installed)."""
    make_transfo_xl_runnable(pytest.MonkeyPatch())
    rng = np.random.default_rng(0)
    segments = np.stack([rng.integers(0, V, (B, L)).astype(np.int32) for _ in range(2)])
    for untie_r in (True, False):
        directory = FIXTURES / "transfo_xl" / f"untie_r_{str(untie_r).lower()}"
        model = transfo_xl(untie_r)
        # with shared biases each layer also names the model's pair, which safetensors refuses to save
        model.save_pretrained(directory / "hf", safe_serialization=untie_r)
        np.savez(directory / "reference.npz", segments=segments, log_probs=np.stack(hf_txl_segments(model, segments)))


@pytest.mark.parametrize("untie_r", [True, False])
def test_transfo_xl_import_and_export_match_transformers(untie_r, tmp_path, runnable_transfo_xl):
    hf_dir, segments, want = transfo_xl_reference(untie_r)
    if has_transfo_xl():  # the recording is what this transformers computes
        from transformers.models.deprecated.transfo_xl import TransfoXLLMHeadModel

        live = hf_txl_segments(TransfoXLLMHeadModel.from_pretrained(hf_dir).eval(), segments)
        assert max(float(np.abs(a - w).max()) for a, w in zip(live, want)) <= 1e-6
    report = import_hf(hf_dir, tmp_path / "run")
    assert (report.family, report.fresh) == ("transfo_xl", [])
    aliases = [] if untie_r else [f"{hf_dir}: transformer.layers.{i}.dec_attn.{b}"
                                  for i in range(2) for b in ("r_r_bias", "r_w_bias")]
    assert report.unused == sorted([f"{hf_dir}: transformer.pos_emb.inv_freq", *aliases])
    model, params, block = ours(tmp_path / "run")
    assert {k: block[k] for k in ("mem_len", "clamp_len", "same_length", "untie_r", "activation")} == dict(
        mem_len=6, clamp_len=5, same_length=True, untie_r=untie_r, activation="relu")
    complete_mapping(records.registry()["transfo-xl"], params)

    got = our_txl_segments(model, params, block, segments, hf_start(block))
    diffs = [float(np.abs(g - w).max()) for g, w in zip(got, want)]
    print(f"\ntransfo-xl untie_r={untie_r}: max |log p| diff per segment {diffs}")
    assert max(diffs) <= TOLERANCE

    export_hf(tmp_path / "run", tmp_path / "out")
    report = import_hf(tmp_path / "out", tmp_path / "back")  # the export reads back as the same run
    back, _ = load_params(tmp_path / "back")
    assert all(np.array_equal(v, flatten_dict(params)[k]) for k, v in flatten_dict(back).items())
    if not untie_r or not has_transfo_xl():  # HF re-initialises each layer's alias of the shared pair on load
        return
    from transformers.models.deprecated.transfo_xl import TransfoXLLMHeadModel

    back, info = TransfoXLLMHeadModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    # inv_freq is a buffer that HF computes at construction from d_model, not a weight
    assert info["missing_keys"] == ["transformer.pos_emb.inv_freq"] and info["unexpected_keys"] == [], info
    again = hf_txl_segments(back.eval(), segments)
    assert max(float(np.abs(a - w).max()) for a, w in zip(again, want)) <= TOLERANCE


# ---------------------------------------------------------------- XLNet

def xlnet(bi_data: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.XLNetConfig(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=24,
                                   ff_activation="gelu_new", mem_len=6, reuse_len=5, clamp_len=7, bi_data=bi_data,
                                   dropout=0.0, layer_norm_eps=1e-6)
    return randomize(transformers.XLNetLMHeadModel(cfg))


def xlnet_batch(rng) -> dict:
    """Left padding on row 1, two segments (+ the <cls> segment), a permutation mask from a random
    factorisation order over 3 targets per row (non-targets seen by all), and their target_mapping."""
    mask = np.ones((B, L), np.int32)
    mask[1, :2] = 0
    ids = np.where(mask > 0, rng.integers(0, V, (B, L)), 0).astype(np.int32)
    segments = np.repeat(np.array([[0, 0, 0, 0, 1, 1, 1, 2]]), B, 0).astype(np.int32)
    perm = np.zeros((B, L, L), np.float32)
    mapping = np.zeros((B, 3, L), np.float32)
    for b in range(B):
        targets = rng.choice(np.arange(2, L), 3, replace=False)
        order = np.full(L, -1)
        order[targets] = rng.permutation(3)
        for i in range(L):
            for j in targets:
                perm[b, i, j] = order[i] <= order[j]  # a target sees only targets earlier in the order
        mapping[b, np.arange(3), np.sort(targets)] = 1
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments, perm_mask=perm, target_mapping=mapping)


def hf_xlnet_segments(model, batches):
    mems, out = None, []
    with torch.no_grad():
        for b in batches:
            o = model(input_ids=torch.tensor(b["input_ids"]).long(), attention_mask=torch.tensor(b["input_mask"]).float(),
                      token_type_ids=torch.tensor(b["segment_ids"]).long(), perm_mask=torch.tensor(b["perm_mask"]),
                      target_mapping=torch.tensor(b["target_mapping"]), mems=mems, use_mems=True)
            out.append(o.logits.numpy())
            mems = o.mems
    return out


def our_xlnet_segments(model, params, batches):
    carry, out = None, []
    for b in batches:
        o = model.apply({"params": params}, {**b, **({} if carry is None else {"carry": carry})})
        out.append(np.asarray(o["logits"]))
        carry = o["carry"]
    return out


@pytest.mark.parametrize("bi_data", [False, True])
def test_xlnet_import_and_export_match_transformers(bi_data, tmp_path):
    hf_model = xlnet(bi_data)
    hf_model.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.fresh, report.unused) == ("xlnet", [], [])
    model, params, block = ours(tmp_path / "run")
    assert {k: block[k] for k in ("mem_len", "reuse_len", "clamp_len", "bi_data", "activation")} == dict(
        mem_len=6, reuse_len=5, clamp_len=7, bi_data=bi_data, activation="gelu_tanh")
    complete_mapping(records.registry()["xlnet"], params)

    rng = np.random.default_rng(1)
    batches = [xlnet_batch(rng) for _ in range(2)]
    want = hf_xlnet_segments(hf_model, batches)
    got = our_xlnet_segments(model, params, batches)
    diffs = [float(np.abs(g - w).max()) for g, w in zip(got, want)]
    print(f"\nxlnet bi_data={bi_data}: max logit diff per segment {diffs}")
    assert max(diffs) <= TOLERANCE

    export_hf(tmp_path / "run", tmp_path / "out")
    back, info = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    again = hf_xlnet_segments(back.eval(), batches)
    assert max(float(np.abs(a - w).max()) for a, w in zip(again, want)) <= TOLERANCE


def test_xlnet_shared_biases_refuse_export(tmp_path):
    """HF XLNet has no shared r_w/r_r/r_s: a run with untie_r=False cannot be written as one."""
    from bertology.interop.hf import write_run

    block = dict(family="xlnet", vocab_size=V, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=24,
                 positions="none", type_vocab_size=0, embedding_norm=False, untie_r=False, pooler=False)
    model = models.build(ml_collections.ConfigDict(block))
    from bertology.interop.hf import _init

    write_run(tmp_path / "run", block, _init(model)())
    with pytest.raises(UserError, match="untie_r"):
        export_hf(tmp_path / "run", tmp_path / "out")


# ---------------------------------------------------------------- XLNet fine-tuning heads

def finetuning_batch(rng) -> dict:
    """XLNet's task layout: a <sep> b <sep> <cls> padded on the left (rows 1 and 2), segments
    0, 1, then 2 for <cls>, 4 for padding (`tasks/encode.py`)."""
    pads = np.array([0, 3, 1, 0])
    mask = (np.arange(L)[None] >= pads[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(0, V, (B, L)), 0).astype(np.int32)
    segments = np.where(mask > 0, np.array([[0, 0, 0, 0, 1, 1, 1, 2]]), 4).astype(np.int32)
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments)


def our_task_model(hf_model, tmp_path, kind: str, num_labels: int, head: str):
    """HF's fine-tuning model as ours: its transformer through import_hf and the family's `trunk`,
    its SequenceSummary projection as the trunk's `summary`, its output layer `head` as ours."""
    from bertology.models.tasks import TaskModel

    hf_model.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert report.fresh == ["lm_bias"]  # a fine-tuning checkpoint has no LM output layer
    params, run_config = load_params(tmp_path / "run")
    cfg, trunk = models.pretrained_encoder(params, run_config["model"])
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}

    def linear(name):
        return {"kernel": jnp.asarray(state[f"{name}.weight"].T), "bias": jnp.asarray(state[f"{name}.bias"])}

    model = TaskModel(cfg, kind, num_labels, "full", run_config["model"]["family"])
    # HF's QA model has no summary (nothing reads it there): ours keeps its initialisation
    summary = (linear("sequence_summary.summary") if "sequence_summary.summary.weight" in state else
               model.init(jax.random.PRNGKey(0), finetuning_batch(np.random.default_rng(0)))["params"]["encoder"]["summary"])
    return model, {"encoder": {**trunk, "summary": summary}, "head": linear(head)}


def hf_inputs(batch) -> dict:
    return dict(input_ids=torch.tensor(batch["input_ids"]).long(),
                attention_mask=torch.tensor(batch["input_mask"]).float(),
                token_type_ids=torch.tensor(batch["segment_ids"]).long())


def test_xlnet_sequence_classification_matches_transformers_with_left_padding(tmp_path):
    """XLNetForSequenceClassification (summary of the last position, dense + tanh, then the
    labels' layer) against our task model on the imported weights: the trunk's `pooled` is HF's
    SequenceSummary, and left padding changes nothing it reads."""
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=24,
                                   ff_activation="gelu_new", dropout=0.0, layer_norm_eps=1e-6, num_labels=3)
    hf_model = randomize(transformers.XLNetForSequenceClassification(cfg))
    model, params = our_task_model(hf_model, tmp_path, "classification", 3, "logits_proj")
    batch = finetuning_batch(np.random.default_rng(2))
    with torch.no_grad():
        want = hf_model(**hf_inputs(batch)).logits.numpy()
    got = np.asarray(model.apply({"params": params}, {k: jnp.asarray(v) for k, v in batch.items()})["logits"])
    print(f"\nxlnet sequence classification: max logit diff {np.abs(got - want).max():.2e}")
    assert np.abs(got - want).max() <= TOLERANCE
    assert np.abs(want[0] - want[3]).max() > 1e-2  # the rows differ, so a constant output would fail


def test_xlnet_question_answering_matches_transformers(tmp_path):
    """XLNetForQuestionAnsweringSimple (one start/end layer over every position) against our QA
    head over the trunk's `sequence`, padded positions included."""
    torch.manual_seed(1)
    cfg = transformers.XLNetConfig(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=24,
                                   ff_activation="gelu_new", dropout=0.0, layer_norm_eps=1e-6)
    hf_model = randomize(transformers.XLNetForQuestionAnsweringSimple(cfg))
    model, params = our_task_model(hf_model, tmp_path, "qa", 2, "qa_outputs")
    batch = finetuning_batch(np.random.default_rng(3))
    with torch.no_grad():
        out = hf_model(**hf_inputs(batch))
    got = model.apply({"params": params}, {k: jnp.asarray(v) for k, v in batch.items()})
    diffs = [float(np.abs(np.asarray(got[k]) - getattr(out, k).numpy()).max()) for k in ("start_logits", "end_logits")]
    print(f"\nxlnet QA (simple): max start/end logit diff {diffs}")
    assert max(diffs) <= TOLERANCE


if __name__ == "__main__":
    record_transfo_xl_references()
