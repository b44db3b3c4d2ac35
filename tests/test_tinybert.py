"""TinyBERT: the uniform layer mapping, sown attention scores against numpy, the three general
distillation terms and the prediction-layer term against numpy, and a tiny general distillation
whose loss falls with the teacher bit-identical afterwards."""

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest
from helpers import short_run_config

from bertology import models, objectives
from bertology.errors import UserError
from bertology.families.tinybert import model as tinybert
from bertology.models.tasks import TaskModel
from bertology.families.tinybert.objective import layers_and_scores
from bertology.train.checkpoint import load_params
from bertology.train.loop import train
from bertology.train.teacher import WithTeacher

V, L, B, HEADS = 37, 8, 3, 2


def _model(family, layers, hidden, **extra):
    block = {"family": family, "num_layers": layers, "vocab_size": V, "hidden_size": hidden, "num_heads": HEADS,
             "intermediate_size": 2 * hidden, "max_position_embeddings": L, "dropout_rate": 0.0,
             "attention_dropout_rate": 0.0, **extra}
    return models.build(ml_collections.ConfigDict(block))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] < np.array([L, 5, 3])[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, V, (B, L)), 0).astype(np.int32)
    return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
                masked_positions=np.zeros((B, 2), np.int32), label=np.array([0, 2, 1], np.int32))


def _init(model, seed, batch=None, scale=0.3):
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), batch or _batch())["params"])
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: rng.normal(0.0, scale, a.shape).astype(np.float32), shapes)


def test_uniform_layer_mapping_is_the_references():
    assert tinybert.layer_map(12, 4) == [0, 3, 6, 9, 12]  # attention 2, 5, 8, 11 from 0; hidden 0, 3, 6, 9, 12
    assert tinybert.layer_map(4, 2) == [0, 2, 4] and tinybert.layer_map(6, 6) == list(range(7))
    with pytest.raises(UserError, match="multiple of the student's 5"):
        tinybert.layer_map(12, 5)


def test_sown_scores_are_the_pre_softmax_scores_and_leave_outputs_alone():
    model = _model("bert", 2, 8)
    params, batch = _init(model, 0), _batch()
    layers, scores = layers_and_scores(model, params, batch, None, projected=False)
    attn = params["encoder"]["attention_1"]
    x = np.asarray(layers[1], np.float64)  # the input of layer 1
    q = np.einsum("ble,ehd->blhd", x, attn["query"]["kernel"]) + attn["query"]["bias"]
    k = np.einsum("ble,ehd->blhd", x, attn["key"]["kernel"]) + attn["key"]["bias"]
    want = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(4)
    np.testing.assert_allclose(np.asarray(scores[1]), want, rtol=1e-4, atol=1e-4)
    plain = model.apply({"params": params}, batch, method=lambda m, b: m.encoder(b)["layers"])
    for a, b in zip(plain, layers):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_general_distillation_terms_match_numpy():
    teacher_model = _model("bert", 4, 12)
    student_model = _model("tinybert", 2, 8, teacher_hidden_size=12)
    teacher, student, batch = _init(teacher_model, 0), _init(student_model, 1), _batch()
    got = objectives.get("tinybert")(student, batch, None, WithTeacher(student_model, teacher_model, teacher))[1]

    s_layers, s_scores = (jax.tree.map(np.asarray, x) for x in layers_and_scores(student_model, student, batch, None, True))
    t_layers, t_scores = (jax.tree.map(np.asarray, x) for x in layers_and_scores(teacher_model, teacher, batch, None, False))
    # the reference: scores + (1 - mask) * -10000, entries <= -100 zeroed, MSE, here over real query rows
    additive = (1.0 - batch["input_mask"][:, None, None, :]) * -10000.0
    real = batch["input_mask"].astype(bool)

    def zeroed(s):
        s = s + additive
        return np.where(s <= -100, 0.0, s)

    att = sum(np.mean(((zeroed(s_scores[m]) - zeroed(t_scores[2 * m + 1])) ** 2).transpose(0, 2, 1, 3)[real])
              for m in range(2))  # student attention 0, 1 <- teacher 1, 3 (0-based)
    hidden = sum(np.mean((s_layers[m] - t_layers[2 * m])[real] ** 2) for m in (1, 2))
    emb = np.mean((s_layers[0] - t_layers[0])[real] ** 2)
    assert float(got["att_loss"]) == pytest.approx(att, rel=1e-4)
    assert float(got["hidden_loss"]) == pytest.approx(hidden, rel=1e-4)
    assert float(got["emb_loss"]) == pytest.approx(emb, rel=1e-4)
    assert float(got["loss"]) == pytest.approx(att + hidden + emb, rel=1e-4)


def test_general_distillation_refuses_unequal_heads():
    teacher_model = _model("bert", 2, 12, num_heads=3)
    student_model = _model("tinybert", 1, 8, teacher_hidden_size=12)
    model = WithTeacher(student_model, teacher_model, _init(teacher_model, 0))
    with pytest.raises(UserError, match="2 attention heads and the teacher 3"):
        objectives.get("tinybert")(_init(student_model, 1), _batch(), None, model)


def test_prediction_layer_soft_cross_entropy_matches_numpy():
    cfg_t = models.encoder_config({"family": "bert", "num_layers": 2, "vocab_size": V, "hidden_size": 12,
                                   "num_heads": HEADS, "intermediate_size": 24, "max_position_embeddings": L})
    cfg_s = models.encoder_config({"family": "bert", "num_layers": 1, "vocab_size": V, "hidden_size": 8,
                                   "num_heads": HEADS, "intermediate_size": 16, "max_position_embeddings": L})
    teacher_model, student_model = TaskModel(cfg_t, "classification", 3), TaskModel(cfg_s, "classification", 3)
    batch = {k: v for k, v in _batch().items() if k != "masked_positions"}
    teacher, student = _init(teacher_model, 0, batch, 1.0), _init(student_model, 1, batch, 1.0)
    objective = objectives.get({"name": "tinybert", "stage": "prediction", "temperature": 2.0})
    got = objective(student, batch, None, WithTeacher(student_model, teacher_model, teacher))[1]
    s = np.asarray(student_model.apply({"params": student}, batch)["logits"], np.float64) / 2
    t = np.asarray(teacher_model.apply({"params": teacher}, batch)["logits"], np.float64) / 2
    p_t = np.exp(t - t.max(-1, keepdims=True))
    p_t /= p_t.sum(-1, keepdims=True)
    log_p_s = s - s.max(-1, keepdims=True) - np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True))
    assert float(got["soft_ce"]) == pytest.approx(np.mean(-(p_t * log_p_s).sum(-1)), rel=1e-5)


def test_tiny_general_distillation_learns_and_keeps_the_teacher_frozen(tmp_path):
    train(short_run_config("bert", "tiny", total_steps=20), tmp_path / "teacher")
    before, _ = load_params(tmp_path / "teacher")
    out = train(short_run_config("tinybert", "tiny", total_steps=30, teacher_checkpoint=str(tmp_path / "teacher")),
                tmp_path / "student")
    history = out["history"]
    loss = [row["loss"] for row in history]
    assert {"att_loss", "hidden_loss", "emb_loss"} <= history[0].keys()
    assert np.mean(loss[-5:]) < 0.7 * np.mean(loss[:5]), loss
    after, _ = load_params(tmp_path / "teacher")
    assert jax.tree.all(jax.tree.map(np.array_equal, before, after))
    student, _ = load_params(tmp_path / "student")
    assert student["fit_dense"]["kernel"].shape == (64, 128)  # tiny teacher: width 128, student half of it


def test_bad_stage_and_temperature_are_one_line_errors():
    model = WithTeacher(_model("tinybert", 1, 8), _model("bert", 2, 8), None)
    with pytest.raises(UserError, match="stage='task' is unknown"):
        objectives.get({"name": "tinybert", "stage": "task"})(None, _batch(), None, model)
    with pytest.raises(UserError, match="temperature 0.0 is not > 0"):
        objectives.get({"name": "tinybert", "stage": "prediction", "temperature": 0.0})(None, _batch(), None, model)
