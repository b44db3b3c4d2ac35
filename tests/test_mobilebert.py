"""MobileBERT: Hugging Face parity of the model (import, logits, export) in its variants; the
progressive knowledge transfer's terms against numpy; stage l changing layer l's parameters only;
and a tiny progressive run whose losses fall with the teacher bit-identical."""

import os

import flax.linen as nn
import helpers
import jax
import ml_collections
import numpy as np
import pytest
from helpers import short_run_config, sst2_from

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, import_hf  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

V, L, B = 97, 12, 3
LENGTHS = (12, 9, 4)
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
             embedding_size=16, intra_bottleneck_size=16, num_feedforward_networks=3, max_position_embeddings=16)
VARIANTS = {  # HF MobileBertConfig keys beyond SMALL
    "paper": {},  # no_norm, trigram input, shared key/query bottleneck, pooler with tanh
    "layer_norm": dict(normalization_type="layer_norm", use_bottleneck_attention=True, trigram_input=False,
                       classifier_activation=False, hidden_act="gelu"),
    "no_bottleneck": dict(use_bottleneck=False, num_feedforward_networks=1, normalization_type="layer_norm"),
}


def _hf_batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, V, (B, L)), 0).astype(np.int32)
    segments = (np.arange(L)[None] >= 5).astype(np.int32) * mask
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments,
                masked_positions=np.broadcast_to(np.arange(L), (B, L)).astype(np.int32))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hf_mobilebert_imports_computes_the_same_logits_and_exports_back(variant, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.MobileBertForPreTraining(transformers.MobileBertConfig(**{**SMALL, **VARIANTS[variant]})).eval()
    with torch.no_grad():  # random values everywhere (norms and biases too), so a swapped tensor shows
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.fresh, report.unused) == ("mobilebert", [], [])
    params, config = load_params(tmp_path / "run")
    model = models.build(ml_collections.ConfigDict(config["model"]))
    batch = _hf_batch()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["input_mask"]),
                 token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long))
    out = model.apply({"params": params}, batch)
    mlm, want = np.asarray(out["mlm_logits"]), ref.prediction_logits.numpy()
    for row, n in enumerate(LENGTHS):  # at real tokens; padding rows are nobody's prediction
        np.testing.assert_allclose(mlm[row, :n], want[row, :n], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(out["nsp_logits"]), ref.seq_relationship_logits.numpy(), atol=1e-4, rtol=0)

    export_hf(tmp_path / "run", tmp_path / "out")
    back, info = transformers.MobileBertForPreTraining.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    original = hf.state_dict()
    for name, tensor in back.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), original[name].numpy(), err_msg=name)


def test_masked_positions_read_the_full_pass_and_trigram_stays_inside_packed_documents():
    model = models.build(ml_collections.ConfigDict({"family": "mobilebert", **_block()}))
    batch = _hf_batch()
    params = nn.meta.unbox(model.init(jax.random.key(0), batch)["params"])
    full = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
    picked = {**batch, "masked_positions": np.array([[3, 0], [8, 2], [1, 1]], np.int32)}
    part = np.asarray(model.apply({"params": params}, picked)["mlm_logits"])
    np.testing.assert_allclose(part, full[np.arange(B)[:, None], picked["masked_positions"]], atol=1e-5)
    # two documents packed in one row give each the embeddings it has alone
    embed = lambda b: np.asarray(model.apply({"params": params}, b, False,  # noqa: E731
                                             method=lambda m, b, d: m.encoder.embeddings(b, d)))
    ids = batch["input_ids"][:1]
    packed = dict(input_ids=ids, packing_ids=np.array([[1] * 5 + [2] * 7], np.int32),
                  positions=np.array([list(range(5)) + list(range(7))], np.int32))
    alone = dict(input_ids=ids[:, 5:], positions=np.arange(7)[None].astype(np.int32))
    np.testing.assert_allclose(embed(packed)[:, 5:], embed(alone), atol=1e-6)


def _block(**extra):
    return {**dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=24, embedding_size=16,
                   intra_bottleneck_size=16, num_feedforward_networks=2, max_position_embeddings=16, activation="relu",
                   dropout_rate=0.0, attention_dropout_rate=0.0), **extra}


def test_bad_settings_are_one_line_errors():
    for extra, message in ((dict(normalization_type="batch_norm"), "normalization_type='batch_norm' is unknown"),
                           (dict(norm="pre"), "model.norm='pre' is not read by MobileBERT"),
                           (dict(embedding_size=64), "embedding_size=64 exceeds hidden_size=32"),
                           (dict(num_feedforward_networks=0), "at least 1")):
        with pytest.raises(UserError, match=message):
            models.build(ml_collections.ConfigDict({"family": "mobilebert", **_block(**extra)}))


# ---- progressive knowledge transfer ----

from bertology import objectives  # noqa: E402
from bertology.families.tinybert.objective import layers_and_scores  # noqa: E402
from bertology.train import optimizer as optimizer_lib  # noqa: E402
from bertology.train.loop import train  # noqa: E402
from bertology.train.step import make_train_step  # noqa: E402
from bertology.train.teacher import WithTeacher  # noqa: E402

P = 4  # prediction slots


def _pair(seed=0):
    """A 2-layer student of width 32 and 4 heads, a BERT teacher of the same shape, random params."""
    student = models.build(ml_collections.ConfigDict({"family": "mobilebert", **_block()}))
    teacher = models.build(ml_collections.ConfigDict(
        {"family": "bert", "vocab_size": V, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 16, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}))
    batch = _pretraining_batch()
    rng = np.random.default_rng(seed)

    def random(model, scale):
        shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), batch)["params"])
        return jax.tree.map(lambda a: rng.normal(0.0, scale, a.shape).astype(np.float32), shapes)

    return student, random(student, 0.3), teacher, random(teacher, 0.3), batch


def _pretraining_batch():
    b = _hf_batch()
    rng = np.random.default_rng(1)
    return {**{k: v for k, v in b.items() if k != "masked_positions"},
            "masked_positions": np.array([[1, 4, 7, 0], [2, 3, 0, 0], [1, 0, 0, 0]], np.int32),
            "masked_ids": rng.integers(1, V, (B, P)).astype(np.int32),
            "masked_weights": np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], np.float32),
            "next_sentence_label": np.array([0, 1, 0], np.int32)}


def _log_softmax(x, axis=-1):
    x = x - x.max(axis, keepdims=True)
    return x - np.log(np.exp(x).sum(axis, keepdims=True))


@pytest.mark.parametrize("layer", [0, 1])
def test_transfer_terms_match_numpy(layer):
    student, s_params, teacher, t_params, batch = _pair()
    got = objectives.get({"name": "mobilebert", "stage": "transfer", "layer": layer})(
        s_params, batch, None, WithTeacher(student, teacher, t_params))[1]
    # the student's full pass (not the transfer method) and the teacher's, in float64
    s_layers, state = student.apply({"params": s_params}, batch, mutable=["intermediates"],
                                    method=lambda m, b: m.encoder(b)["layers"])
    s = np.asarray(s_layers[layer + 1], np.float64)
    s_scores = np.asarray(state["intermediates"]["encoder"][f"layer_{layer}"]["attention"]["scores"][0], np.float64)
    t_layers, t_scores = layers_and_scores(teacher, t_params, batch, None, projected=False)
    t, t_scores = np.asarray(t_layers[layer + 1], np.float64), np.asarray(t_scores[layer], np.float64)
    real = batch["input_mask"].astype(bool)

    def ln(x):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)

    fmt = np.mean(((ln(s) - ln(t)) ** 2)[real])
    mean = np.mean(((s.mean(-1) - t.mean(-1)) ** 2)[real])
    var = np.mean(np.abs(s.var(-1) - t.var(-1))[real])
    keys = real[:, None, None, :]
    log_s = _log_softmax(np.where(keys, s_scores, -1e30))
    log_t = _log_softmax(np.where(keys, t_scores, -1e30))
    kl = np.where(keys, np.exp(log_t) * (log_t - log_s), 0.0).sum(-1).mean(1)  # [B, L]
    att = np.mean(kl[real])
    for name, want in (("fmt_loss", fmt), ("mean_loss", mean), ("var_loss", var), ("att_loss", att)):
        assert float(got[name]) == pytest.approx(want, rel=1e-4, abs=1e-7), name
    assert float(got["loss"]) == pytest.approx(100 * fmt + 5000 * mean + 5 * var + att, rel=1e-4)


def test_distillation_terms_match_numpy():
    student, s_params, teacher, t_params, batch = _pair()
    got = objectives.get({"name": "mobilebert", "alpha": 0.25})(s_params, batch, None,
                                                                WithTeacher(student, teacher, t_params))[1]
    s_out = student.apply({"params": s_params}, batch)
    s = np.asarray(s_out["mlm_logits"], np.float64)
    t = np.asarray(teacher.apply({"params": t_params}, batch)["mlm_logits"], np.float64)
    w = batch["masked_weights"]
    log_s = _log_softmax(s)
    nll = -np.take_along_axis(log_s, batch["masked_ids"][..., None], -1)[..., 0]
    soft = -(np.exp(_log_softmax(t)) * log_s).sum(-1)
    nsp = -_log_softmax(np.asarray(s_out["nsp_logits"], np.float64))[np.arange(B), batch["next_sentence_label"]]
    mlm, kd = (nll * w).sum() / (w.sum() + 1e-5), (soft * w).sum() / (w.sum() + 1e-5)
    assert float(got["mlm_loss"]) == pytest.approx(mlm, rel=1e-5)
    assert float(got["kd_loss"]) == pytest.approx(kd, rel=1e-5)
    assert float(got["loss"]) == pytest.approx(0.25 * mlm + 0.75 * kd + nsp.mean(), rel=1e-5)


@pytest.mark.parametrize("layer", [0, 1])
def test_a_transfer_stage_changes_its_layer_only(layer):
    student, s_params, teacher, t_params, batch = _pair()
    config = ml_collections.ConfigDict(helpers.config("mobilebert", f"tiny,{layer}").optimizer.to_dict())
    tx, lr = optimizer_lib.make(config, 10)
    objective = objectives.get({"name": "mobilebert", "stage": "transfer", "layer": layer})
    step = jax.jit(make_train_step(WithTeacher(student, teacher, t_params), objective, tx, lr, 1))
    state = {"step": np.zeros((), np.int32), "params": s_params, "opt_state": tx.init(s_params)}
    teacher_before = jax.tree.map(np.array, t_params)
    for _ in range(3):
        state, _ = step(state, batch, jax.random.key(0))
    trained = {f"layer_{layer}", *(("embeddings",) if layer == 0 else ())}
    for name, before in s_params["encoder"].items():
        after = state["params"]["encoder"][name]
        same = jax.tree.all(jax.tree.map(np.array_equal, before, after))
        assert same != (name in trained), name
    for head in ("mlm", "nsp"):
        assert jax.tree.all(jax.tree.map(np.array_equal, s_params[head], state["params"][head]))
    assert jax.tree.all(jax.tree.map(np.array_equal, teacher_before, t_params))


def test_bad_objective_options_are_one_line_errors():
    student, s_params, teacher, t_params, batch = _pair()
    model = WithTeacher(student, teacher, t_params)
    with pytest.raises(UserError, match="layer=2 is not a layer of the 2-layer student"):
        objectives.get({"name": "mobilebert", "stage": "transfer", "layer": 2})(s_params, batch, None, model)
    with pytest.raises(UserError, match="stage='progressive' is unknown"):
        objectives.get({"name": "mobilebert", "stage": "progressive"})(s_params, batch, None, model)
    with pytest.raises(UserError, match="needs a BERT teacher"):
        objectives.get("mobilebert")(s_params, batch, None, student)
    with pytest.raises(UserError, match="stage '5' is not a layer"):
        helpers.config("mobilebert", "tiny,5")


RUN = {"data.max_seq_length": 32, "data.max_predictions_per_seq": 5, "batch_size": 8, "mesh.shape": (1, 1),
       "log_every": 5, "eval_every": 0, "checkpoint_every": 1000}


def test_tiny_progressive_transfer_then_distillation_learns_with_the_teacher_frozen(tmp_path):
    train(short_run_config("bert", "tiny", RUN, total_steps=20), tmp_path / "teacher")
    teacher_before, _ = load_params(tmp_path / "teacher")
    common = dict(teacher_checkpoint=str(tmp_path / "teacher"))
    histories, previous = {}, None
    for stage, steps in (("0", 20), ("1", 20), ("", 30)):
        arg = f"tiny,{stage}" if stage else "tiny"
        overrides = {**common, "total_steps": steps, "optimizer.warmup_steps": 2}
        if previous:
            overrides["init_checkpoint"] = str(previous)
        previous = tmp_path / f"stage{stage or 'distill'}"
        history = train(short_run_config("mobilebert", arg, RUN, **overrides), previous)["history"]
        histories[stage] = [row["loss"] for row in history]
    for stage, fall in (("0", 0.7), ("1", 0.9), ("", 0.95)):  # transfer halves stage 0's loss; MLM is slower
        loss = histories[stage]
        assert np.mean(loss[-5:]) < fall * np.mean(loss[:5]), (stage, loss)
    after, _ = load_params(tmp_path / "teacher")
    assert jax.tree.all(jax.tree.map(np.array_equal, teacher_before, after))
    stage0, _ = load_params(tmp_path / "stage0")
    stage1, _ = load_params(tmp_path / "stage1")
    for name in ("embeddings", "layer_0"):  # frozen through stage 1
        assert jax.tree.all(jax.tree.map(np.array_equal, stage0["encoder"][name], stage1["encoder"][name]))


def test_base_preset_is_the_papers_mobilebert():
    """configs/mobilebert.py:base builds HF's default MobileBertConfig (the released
    google/mobilebert-uncased shape): the same trunk, parameter for parameter."""
    transformers = pytest.importorskip("transformers")
    config = helpers.config("mobilebert", "base")
    config.model.vocab_size = 30522
    model = models.build(config.model)
    batch = {k: np.zeros((1, 4), np.int32) for k in ("input_ids", "segment_ids", "masked_positions")}
    batch["input_mask"] = np.ones((1, 4), np.int32)
    shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), batch)["params"]))
    ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["encoder"]))
    hf = transformers.MobileBertModel(transformers.MobileBertConfig())
    assert ours == sum(p.numel() for p in hf.parameters())  # 24.6M, the paper's "25.3M" class


# ---- fine-tuning trunk (`mobilebert.task_trunk`) ----

HEADS = {  # our task kind -> (HF class, its output layer, our outputs, HF outputs)
    "classification": ("MobileBertForSequenceClassification", "classifier", ("logits",), ("logits",)),
    "qa": ("MobileBertForQuestionAnswering", "qa_outputs", ("start_logits", "end_logits"),
           ("start_logits", "end_logits")),
    "token": ("MobileBertForTokenClassification", "classifier", ("logits",), ("logits",)),
}


@pytest.mark.parametrize("kind", sorted(HEADS))
@pytest.mark.parametrize("variant", ["paper", "layer_norm"])
def test_hf_mobilebert_task_models_match_our_task_model_with_padding(kind, variant, tmp_path):
    """HF's fine-tuning models on random weights, imported (trunk through import_hf and the
    family's `trunk`, the output layer as our `head`) into our TaskModel: classification reads
    the pooler (dense + tanh, or the first token as is without classifier_activation), QA and
    tagging every position of the sequence, padded rows included."""
    from bertology.models.tasks import TaskModel

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_class, layer, ours_out, hf_out = HEADS[kind]
    labels = 2 if kind == "qa" else 3
    torch.manual_seed(1)
    hf = getattr(transformers, hf_class)(transformers.MobileBertConfig(**{**SMALL, **VARIANTS[variant]},
                                                                       num_labels=labels)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert report.family == "mobilebert" and all(not name.startswith("encoder") for name in report.fresh)
    params, run = load_params(tmp_path / "run")
    cfg, trunk = models.pretrained_encoder(params, run["model"])
    state = hf.state_dict()
    head = {"kernel": state[f"{layer}.weight"].numpy().T, "bias": state[f"{layer}.bias"].numpy()}
    model = TaskModel(cfg, kind, labels, "full", run["model"]["family"])
    batch = {k: v for k, v in _hf_batch(3).items() if k != "masked_positions"}
    got = model.apply({"params": {"encoder": trunk, "head": head}}, batch)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                  attention_mask=torch.tensor(batch["input_mask"]),
                  token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long))
    for ours, theirs in zip(ours_out, hf_out):
        reference = getattr(want, theirs).numpy()
        assert np.ptp(reference, axis=0).max() > 1e-3  # rows differ by 10x the tolerance: a constant output fails
        np.testing.assert_allclose(np.asarray(got[ours]), reference, atol=1e-4, rtol=0, err_msg=ours)


def test_mobilebert_finetunes_from_its_pretraining_run(tmp_path):
    """A tiny MobileBERT run (MLM + NSP, the BERT objective its outputs share, so no teacher is
    needed) fine-tuned on the SST-2 fixture from its init_checkpoint: the task model is built with
    the family's trunk, takes every trunk tensor and adds none, and the loss falls."""
    from flax.traverse_util import flatten_dict

    from bertology.families.mobilebert import model as mobilebert

    train(short_run_config("mobilebert", "tiny", RUN, total_steps=2, objective={"name": "bert"}), tmp_path / "pre")
    result = sst2_from(tmp_path / "pre", tmp_path / "ft", steps=30, max_seq_length=32, drop=0.2)
    pretrained = flatten_dict(mobilebert.trunk(load_params(tmp_path / "pre")[0]))
    assert set(flatten_dict(result["params"]["encoder"])) == set(pretrained)
