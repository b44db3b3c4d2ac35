"""DistilBERT and the frozen teacher: the layer rule and student initialisation, the loss terms
against numpy, the teacher bit-identical and absent from checkpoints after training, a tiny
distillation whose loss falls, exact resume with a teacher, and HF DistilBertForMaskedLM parity."""

import json
import os
import shutil

import flax.linen as nn
import helpers
import jax
import ml_collections
import numpy as np
import pytest
from helpers import assert_teacher_frozen_while_the_student_trains

from bertology import models, objectives
from bertology.errors import UserError
from bertology.families.distilbert import model as distilbert
from bertology.objectives.distil import token_outputs
from bertology.train import run as run_lib
from bertology.train import teacher as teacher_lib
from bertology.train.checkpoint import load_params
from bertology.train.loop import train
from bertology.train.teacher import WithTeacher

os.environ.setdefault("HF_HUB_OFFLINE", "1")

V, L, B = 61, 10, 3
SMALL = dict(vocab_size=V, hidden_size=16, num_heads=2, intermediate_size=32, max_position_embeddings=L,
             dropout_rate=0.0, attention_dropout_rate=0.0)


def _model(family, layers, **extra):
    block = {"family": family, "num_layers": layers, **SMALL, **extra}
    if family == "distilbert":
        block.update(type_vocab_size=0, pooler=False)
    return models.build(ml_collections.ConfigDict(block))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] < np.array([L, 7, 4])[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, V, (B, L)), 0).astype(np.int32)
    masked_positions = np.array([[1, 3, 5], [0, 2, 6], [1, 2, 0]], np.int32)
    masked_weights = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], np.float32)
    return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids), masked_positions=masked_positions,
                masked_ids=rng.integers(1, V, (B, 3)).astype(np.int32), masked_weights=masked_weights)


def _init(model, seed, scale=0.2):
    """Random values in every parameter (norms and biases too, so a swapped tensor shows); shapes
    from an abstract init, so nothing is compiled."""
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), _batch())["params"])
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: rng.normal(0.0, scale, a.shape).astype(np.float32), shapes)


def test_layer_rule_is_the_references_and_spreads_evenly():
    assert distilbert.teacher_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # scripts/extract_distilbert.py
    assert distilbert.teacher_layers(24, 6) == [0, 5, 9, 14, 18, 23]
    assert distilbert.teacher_layers(4, 4) == [0, 1, 2, 3] and distilbert.teacher_layers(2, 1) == [0]
    with pytest.raises(UserError, match="cannot be taken from a 4-layer teacher"):
        distilbert.teacher_layers(4, 5)


def test_student_starts_from_the_named_teacher_layers():
    teacher = _init(_model("bert", 12), 0)
    student = distilbert.from_teacher(teacher, _init(_model("distilbert", 6), 1))
    for j, i in enumerate([0, 2, 4, 7, 9, 11]):
        for block in ("attention", "ffn"):
            got, want = student["encoder"][f"{block}_{j}"], teacher["encoder"][f"{block}_{i}"]
            assert jax.tree.all(jax.tree.map(np.array_equal, got, want)), (block, j, i)
    assert jax.tree.all(jax.tree.map(np.array_equal, student["mlm"], teacher["mlm"]))
    np.testing.assert_array_equal(student["encoder"]["embeddings"]["token"]["embedding"],
                                  teacher["encoder"]["embeddings"]["token"]["embedding"])


def test_a_full_depth_student_computes_the_teacher():
    """Copying every layer (segment row 0 folded into the positions) reproduces the teacher's
    logits and hidden states on one-segment input: nothing is lost in the copy."""
    teacher_model, student_model = _model("bert", 2), _model("distilbert", 2)
    teacher = _init(teacher_model, 0)
    student = distilbert.from_teacher(teacher, _init(student_model, 1))
    batch = _batch()
    t_logits, t_hidden = token_outputs(teacher_model, teacher, batch, None)
    s_logits, s_hidden = token_outputs(student_model, student, batch, None)
    real = batch["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(s_logits)[real], np.asarray(t_logits)[real], atol=1e-5)
    np.testing.assert_allclose(np.asarray(s_hidden)[real], np.asarray(t_hidden)[real], atol=1e-5)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_terms_match_numpy():
    teacher_model, student_model = _model("bert", 2), _model("distilbert", 1)
    # a wide init: logits far apart, so the KL is not a small difference of large numbers
    teacher, student = _init(teacher_model, 0, scale=1.0), _init(student_model, 1, scale=1.0)
    batch = _batch()
    objective = objectives.get({"name": "distil", "temperature": 2.0})
    model = WithTeacher(student_model, teacher_model, teacher)
    got = {k: float(v) for k, v in objective(student, batch, None, model)[1].items()}

    s_logits, s_hidden = (np.asarray(x, np.float64) for x in token_outputs(student_model, student, batch, None))
    t_logits, t_hidden = (np.asarray(x, np.float64) for x in token_outputs(teacher_model, teacher, batch, None))
    real = batch["input_mask"].astype(bool)
    T = 2.0
    p_t = np.exp(_log_softmax(t_logits / T))[real]
    kd = T * T * np.sum(p_t * (np.log(p_t) - _log_softmax(s_logits / T)[real])) / real.sum()  # KLDivLoss batchmean
    s, t = s_hidden[real], t_hidden[real]
    cos = np.mean(1 - np.sum(s * t, -1) / (np.linalg.norm(s, axis=-1) * np.linalg.norm(t, axis=-1)))
    w = batch["masked_weights"]
    rows = np.take_along_axis(_log_softmax(s_logits), batch["masked_positions"][..., None], 1)
    nll = -np.take_along_axis(rows, batch["masked_ids"][..., None], -1)[..., 0]
    mlm = np.sum(nll * w) / (w.sum() + 1e-5)
    assert got["kd_loss"] == pytest.approx(kd, rel=1e-5)
    assert got["cos_loss"] == pytest.approx(cos, rel=1e-5)
    assert got["mlm_loss"] == pytest.approx(mlm, rel=1e-5)
    assert got["loss"] == pytest.approx(5 * kd + 2 * mlm + cos, rel=1e-5)


def test_distil_objective_without_a_teacher_is_refused():
    student_model = _model("distilbert", 1)
    with pytest.raises(UserError, match="needs a teacher; set --config.teacher_checkpoint"):
        objectives.get("distil")(_init(student_model, 0), _batch(), None, student_model)


# --- runs: a tiny BERT teacher, then 2-layer DistilBERT students ----------------------------------

RUN = {"data.max_seq_length": 32, "data.max_predictions_per_seq": 5, "batch_size": 8, "mesh.shape": (1, 1),
       "log_every": 5, "eval_every": 0, "checkpoint_every": 1000}


def _config(name, preset, **overrides):
    c = helpers.config(name, preset)
    for key, value in {**RUN, **overrides}.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("teacher")
    train(_config("bert", "tiny", total_steps=20, **{"optimizer.warmup_steps": 5}), d)
    return d


def _student(teacher_dir, **overrides):
    # the tiny preset halves the teacher's 2 layers to 1
    return _config("distilbert", "tiny",
                   **{"teacher_checkpoint": str(teacher_dir), "optimizer.warmup_steps": 5, **overrides})


def test_distillation_learns_keeps_the_teacher_frozen_and_out_of_checkpoints(teacher_dir, tmp_path):
    out = train(_student(teacher_dir, total_steps=30), tmp_path / "student")
    loss = [row["loss"] for row in out["history"]]
    assert np.mean(loss[-5:]) < 0.9 * np.mean(loss[:5]), loss
    assert {"kd_loss", "mlm_loss", "cos_loss"} <= out["history"][0].keys()
    assert set(out["state"]) == {"step", "params", "opt_state", run_lib.SKIPPED}  # no teacher in the state
    teacher_params, _ = load_params(teacher_dir)
    student_params, _ = load_params(tmp_path / "student")
    assert "segment" not in student_params["encoder"]["embeddings"] and "pooler" not in student_params["encoder"]

    # The teacher as placed on the mesh, after training steps: bit-identical to the checkpoint.
    teacher = teacher_lib.load(teacher_dir)
    config = _student(teacher_dir, total_steps=3)
    config.model.vocab_size = teacher.model.cfg.vocab_size
    config.data.vocab = teacher.config["data"]["vocab"]
    batch = {k: np.tile(v, (3, 1))[:8] for k, v in _batch().items()}  # 8 rows of L tokens
    assert_teacher_frozen_while_the_student_trains(config, batch, teacher, teacher_params, tmp_path / "frozen", 3)


def test_resume_with_a_teacher_is_exact(teacher_dir, tmp_path):
    full = train(_student(teacher_dir, total_steps=8, checkpoint_every=4), tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "8")  # as if stopped after the step-4 checkpoint
    resumed = train(_student(teacher_dir, total_steps=8, checkpoint_every=4), tmp_path / "run")
    assert resumed["history"][0]["step"] == 5
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in full["history"][4:]]
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                        full["state"]["params"], resumed["state"]["params"])
    assert jax.tree.all(same)
    with pytest.raises(UserError, match="teacher_checkpoint"):  # another teacher is config drift
        train(_student(teacher_dir, total_steps=9, allow_config_change="total_steps",
                       teacher_checkpoint=str(tmp_path / "run")), tmp_path / "run")


# --- Hugging Face DistilBertForMaskedLM -------------------------------------------------------------

def test_distilbert_matches_transformers_and_round_trips(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bertology.interop import export_hf, import_hf

    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=V, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                                        max_position_embeddings=16)
    hf = transformers.DistilBertForMaskedLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.eval().save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert report.family == "distilbert" and report.fresh == [] and report.unused == []

    batch = _batch()
    params, run_config = load_params(tmp_path / "run")
    model = models.build(ml_collections.ConfigDict(run_config["model"]))
    ours = np.asarray(model.apply({"params": params}, {**batch, "masked_positions": np.broadcast_to(
        np.arange(L, dtype=np.int32), (B, L))})["mlm_logits"])

    def hf_logits(m):
        with torch.no_grad():
            return m(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long)).logits.numpy()

    real = batch["input_mask"].astype(bool)
    reference = hf_logits(hf)
    diff = float(np.abs(ours - reference)[real].max())
    print(f"\ndistilbert max abs logit diff vs transformers: {diff:.2e}")
    assert diff <= 1e-4

    (target,) = export_hf(tmp_path / "run", tmp_path / "export")
    reloaded, info = transformers.DistilBertForMaskedLM.from_pretrained(target, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert json.loads((target / "config.json").read_text())["architectures"] == ["DistilBertForMaskedLM"]
    np.testing.assert_allclose(hf_logits(reloaded.eval())[real], reference[real], atol=1e-6)
