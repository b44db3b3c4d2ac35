"""LSTM2LSTM (Ramachandran, Liu & Le 2017, the paper's LSTM version): two one-layer LSTM LM runs of
the tiny preset (random, from different seeds) become one encoder-decoder
(`families/lstm2lstm/combine.py`) whose LM passes give the LM runs' own logits; the decoder against
numpy written out by hand (multi-layer attention, the residual to the softmax, input feeding); the
shared objective against its three terms from the LM runs' networks; greedy and beam decoding
against teacher-forced recomputation; fine-tuning on the embedded task; combine's refusals."""

import json
import shutil

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from bertology import models, objectives
from bertology.data.tokenizers import for_data
from bertology.data.transforms import seq2seq_rows
from bertology.families.lstm2lstm import combine
from bertology.families.lstm2lstm.model import Lstm2LstmConfig, Model
from bertology.generation import beam_search, generate
from bertology.train.checkpoint import load_params
from bertology.train.finetune import finetune

SOURCE, TARGET = 16, 8  # row lengths of the seq2seq rows here


def lm_params(block, seed):
    """An LSTM LM's random parameters, its output bias random too (exercised, not zeros)."""
    model = models.build(block)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), {"input_ids": np.zeros((1, 4), np.int32)})["params"])
    params["output_bias"] = np.random.default_rng(seed).normal(size=block["vocab_size"]).astype(np.float32)
    return params


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(source LM, target LM, combined run) directories: configs/lstm_lm.py:tiny with one layer
    (the paper's LMs), random parameters from seeds 0 and 1, and the LSTM2LSTM made of them."""
    root = tmp_path_factory.mktemp("lstm2lstm")
    c = helpers.config("lstm_lm", "tiny")
    c.model.update(n_layers=1, vocab_size=for_data(c.data).vocab_size)
    for seed, name in enumerate(("source", "target")):
        helpers.write_run(root / name, c, lm_params(c.model.to_dict(), seed))
    return helpers.combined_runs(combine.main, root)


@pytest.fixture(scope="module")
def rows(runs):
    """Seq2seq rows of 4 validation examples of the embedded task, the decoder starting at EOS."""
    return helpers.embedded_seq2seq_rows(runs[2], 4, SOURCE, TARGET)


def lm_logits(params, ids, config):
    """The LM run's own next-word logits (its own network, `families/lstm`)."""
    logits = jax.jit(models.build(config["model"]).apply)({"params": params}, {"input_ids": ids})["logits"]
    return np.asarray(logits, np.float64)


def logits(model, params, batch, method=None):
    """`model`'s logits (`method`'s, else the seq2seq ones) in float64."""
    out = jax.jit(lambda p, b: model.apply({"params": p}, b, method=method))(params, batch)
    return np.asarray(out if method else out["logits"], np.float64)


def nll(logits, targets, weights):
    """Weighted mean token cross-entropy, in float64."""
    top = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    label = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float(((logz - label) * weights).sum() / weights.sum())


def test_lm_passes_are_the_two_lm_runs_and_the_rest_is_fresh(runs, rows):
    """The combined run's `source_lm` and `target_lm` compute the LM runs' own logits (their
    tensors copied whole); the upper layers and attention are the fresh initialisation; the block
    is configs/lstm2lstm.py's, the from-scratch baseline."""
    (source, source_config), (target, target_config), (params, config) = (load_params(r) for r in runs)
    block = config["model"]
    scratch = helpers.config("lstm2lstm", "embedded").model.to_dict()
    assert block == {**scratch, "vocab_size": source_config["model"]["vocab_size"]}
    assert (block["lm_layers"], block["n_layers"]) == (1, 2)
    model = models.build(block)
    theirs = lm_logits(source, rows["input_ids"], source_config)
    np.testing.assert_allclose(logits(model, params, rows, Model.source_lm), theirs, atol=1e-5)
    ours = logits(model, params, rows, Model.target_lm)
    theirs = lm_logits(target, rows["decoder_input_ids"], target_config)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.abs(theirs - lm_logits(source, rows["decoder_input_ids"], source_config)).max() > 0.1  # runs differ
    fresh = flatten_dict(combine.fresh_params(block))
    flat = flatten_dict(params)
    assert set(flat) == set(fresh)
    for side, lm in (("source", source), ("target", target)):  # embedding, layer, output bias: the run's own
        for k, v in flatten_dict(lm).items():
            np.testing.assert_array_equal(flat[(side, *k)], v, err_msg=str(k))
    for k in fresh:
        if k[0] in ("encoder", "decoder"):
            np.testing.assert_array_equal(flat[k], fresh[k], err_msg=str(k))
    # the source reaches the decoder: the seq2seq logits are not the target LM's
    assert np.abs(logits(model, params, rows) - theirs).max() > 1e-2


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstmp(p, name, x, c, h):
    """One step of ELMo's LSTM cell with projection: gates i, j, f, o, forget bias 1."""
    i, j, f, o = np.split(np.concatenate([x, h], -1) @ p[f"{name}_kernel"] + p[f"{name}_bias"], 4, axis=-1)
    c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j)
    return c, (sigmoid(o) * np.tanh(c)) @ p[f"{name}_projection"]


def layer(p, name, xs, width):
    """The layer over xs [batch, length, in] from zero states: its outputs [batch, length, P]."""
    c, h, out = np.zeros((len(xs), width)), np.zeros((len(xs), p[f"{name}_projection"].shape[1])), []
    for t in range(xs.shape[1]):
        c, h = lstmp(p, name, xs[:, t], c, h)
        out.append(h)
    return np.stack(out, 1)


def reference_logits(p, batch, d):
    """The paper's network (§2, the model docstring) in numpy: one LM layer and two fresh layers
    (residual between them) per side, cells of d."""
    first = layer(p["source"]["lstm"], "layer_0", p["source"]["embed"]["embedding"][batch["input_ids"]], d)
    lower = layer(p["encoder"], "layer_0", first, d)
    top = layer(p["encoder"], "layer_1", lower, d) + lower
    table = p["target"]["embed"]["embedding"]
    lm = layer(p["target"]["lstm"], "layer_0", table[batch["decoder_input_ids"]], d)
    w = p["decoder"]
    rows, size = lm.shape[0], lm.shape[-1]
    c, h, feed, out = np.zeros((2, rows, d)), np.zeros((2, rows, size)), np.zeros((rows, size)), []
    for t in range(lm.shape[1]):
        c[0], h[0] = lstmp(w, "layer_0", np.concatenate([lm[:, t], feed], -1), c[0], h[0])  # input feeding
        c[1], h[1] = lstmp(w, "layer_1", h[0], c[1], h[1])
        q = h[1] + h[0]
        scores = np.einsum("bld,bd->bl", top, q @ w["attention_kernel"] + w["attention_bias"])
        scores = np.where(batch["input_mask"] > 0, scores, -np.inf)  # padding is never attended to
        alpha = np.exp(scores - scores.max(-1, keepdims=True))
        alpha /= alpha.sum(-1, keepdims=True)
        contexts = [np.einsum("bl,bld->bd", alpha, m) for m in (first, top)]  # one α, both layers
        feed = np.tanh(np.concatenate([*contexts, q], -1) @ w["combine_kernel"] + w["combine_bias"])
        out.append((feed + lm[:, t]) @ table.T + p["target"]["output_bias"])  # residual to the softmax
    return np.stack(out, 1)


def test_decoder_matches_numpy_teacher_forced_and_step_by_step():
    """At a tiny size (vocab 13, P 4, cells 6, three layers a side), the teacher-forced logits and
    those of the incremental steps generation runs (`decoding_cache`, `next_token`) against numpy."""
    cfg = Lstm2LstmConfig(vocab_size=13, projection_dim=4, lstm_dim=6, lm_layers=1, n_layers=3,
                          use_skip_connections=True, dropout_rate=0.0)
    rng = np.random.default_rng(0)
    sources = [rng.integers(5, 13, n) for n in (6, 3)]
    targets = [rng.integers(5, 13, n) for n in (4, 2)]
    batch = seq2seq_rows(sources, targets, 6, 4, pad_id=0, decoder_start=3)
    model = Model(cfg)
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    params = jax.tree.map(lambda x: x + 0.3 * rng.normal(size=x.shape), params)  # biases and output biases too
    expected = reference_logits(jax.tree.map(lambda x: np.asarray(x, np.float64), params), batch, cfg.lstm_dim)
    np.testing.assert_allclose(jax.jit(model.apply)({"params": params}, batch)["logits"], expected, atol=1e-5)
    cache = jax.jit(lambda p, b: model.apply({"params": p}, b, method=Model.decoding_cache))(params, batch)
    step = jax.jit(lambda p, cache, token: model.apply({"params": p}, cache, token, method=Model.next_token))
    for t in range(4):
        out, cache = step(params, cache, jnp.asarray(batch["decoder_input_ids"][:, t]))
        np.testing.assert_allclose(out, expected[:, t], atol=1e-5)


def test_loss_is_seq2seq_plus_the_weighted_lm_losses(runs, rows):
    """Seq2seq NLL (the model's logits) + 0.3 x the source LM run's loss over the source + 0.7 x the
    target LM run's over the targets, both from the LM runs' own networks; 0 and 0: the seq2seq NLL."""
    (source, source_config), (target, target_config), (params, config) = (load_params(r) for r in runs)
    model = models.build(config["model"])
    seq2seq = nll(logits(model, params, rows), rows["targets"], rows["target_weights"])
    src_logits = lm_logits(source, rows["input_ids"], source_config)
    source_lm = nll(src_logits[:, :-1], rows["input_ids"][:, 1:], rows["input_mask"][:, 1:])
    target_lm = nll(lm_logits(target, rows["decoder_input_ids"], target_config), rows["targets"], rows["target_weights"])
    combined = objectives.get({"name": "gpt2gpt", "source_lm_weight": 0.3, "target_lm_weight": 0.7})
    loss, metrics = jax.jit(lambda p: combined(p, rows, None, model))(params)
    assert float(loss) == pytest.approx(seq2seq + 0.3 * source_lm + 0.7 * target_lm, rel=1e-5)
    assert float(metrics["source_lm_loss"]) == pytest.approx(source_lm, rel=1e-5)
    assert float(metrics["target_lm_loss"]) == pytest.approx(target_lm, rel=1e-5)
    plain, _ = jax.jit(lambda p: objectives.get({"name": "gpt2gpt", "source_lm_weight": 0.0, "target_lm_weight": 0.0})(
        p, rows, None, model))(params)
    assert float(plain) == pytest.approx(seq2seq, rel=1e-5)


def test_greedy_and_beam_decoding_equal_teacher_forced_recomputation(runs, rows):
    """Greedy tokens are the argmaxes of the teacher-forced logits on them; the best beam's score is
    the teacher-forced sum of its log-probabilities over its length (the cache follows the beams)."""
    params, config = load_params(runs[2])
    model = models.build(config["model"])
    start = for_data(config["data"]).eos_id
    src, mask = rows["input_ids"], rows["input_mask"]
    n = 5

    def teacher_forced(tokens):
        ids = np.concatenate([np.full((len(tokens), 1), start), tokens[:, :-1]], 1).astype(np.int32)
        batch = {"input_ids": src, "input_mask": mask, "decoder_input_ids": ids}
        return np.asarray(jax.nn.log_softmax(logits(model, params, batch)), np.float64)

    greedy = generate(model, params, src, mask, max_new_tokens=n, decoder_start_id=start)
    np.testing.assert_array_equal(teacher_forced(greedy).argmax(-1), greedy)
    beams = beam_search(model, params, src, mask, num_beams=3, max_new_tokens=n, decoder_start_id=start)
    best = beams.tokens[:, 0]
    chosen = np.take_along_axis(teacher_forced(best), best[..., None], -1)[..., 0]
    np.testing.assert_allclose(beams.scores[:, 0], chosen.sum(-1) / n, rtol=1e-4)


def test_lstm2lstm_fine_tunes_on_the_embedded_task(runs, rows, tmp_path):
    """12 steps from the combined run: the training loss (all three terms) and the seq2seq NLL of
    held-out rows fall."""
    config = helpers.config("lstm2lstm", "embedded")
    config.update(init_checkpoint=str(runs[2]), total_steps=12, batch_size=8, log_every=4, eval_examples=2,
                  eval_batch_size=2)
    config.optimizer.learning_rate = 3e-3  # configs/lstm_lm.py's: 12 steps at the recipe's 1e-3 move little
    config.data.update(max_seq_length=SOURCE, max_target_length=TARGET)
    config.generation.update(max_new_tokens=3, num_beams=1)
    config.mesh.shape = (1, 1)
    results = finetune(config, tmp_path / "run")
    assert len(results["train_loss"]) == 3 and results["train_loss"][-1] < results["train_loss"][0]
    start, run_config = load_params(runs[2])
    model = models.build(run_config["model"])
    before, after = (nll(logits(model, p, rows), rows["targets"], rows["target_weights"])
                     for p in (start, results["params"]))
    assert after < before - 0.5, (before, after)


def test_flops_count_both_sides_the_attention_and_the_lm_passes():
    c = helpers.config("lstm2lstm", "embedded")
    c.model.update(vocab_size=100, projection_dim=4, lstm_dim=6)
    c.data.update(max_seq_length=10, max_target_length=5)
    layer = 2 * (4 + 4) * 24 + 2 * 6 * 4  # [x, h] @ W (4 gates of 6) and the 6 -> 4 projection
    lm = layer + 2 * 4 * 100  # an LM: its layer and the 4 -> 100 softmax
    fed = 2 * (8 + 4) * 24 + 2 * 6 * 4  # the decoder's fresh layer also reads h~
    attention = 2 * 4 * 4 + 2 * 10 * 4 + 2 * 2 * 10 * 4 + 2 * 12 * 4  # W1 h, scores, two contexts, W2
    # per source token: encoder (LM layer, fresh layer), source LM; half a target token each: decoder, target LM
    assert models.flops_per_token(c) == 3 * (2 * layer + lm + (lm + fed + attention + lm) / 2)
    c.update(source_lm_weight=0.0, target_lm_weight=0.0)  # the LM passes do not run
    assert models.flops_per_token(c) == 3 * (2 * layer + (lm + fed + attention) / 2)


def _edited(run, tmp_path, name, edit):
    """A copy of `run` whose config.json `edit(config)` changed."""
    copy = shutil.copytree(run, tmp_path / name)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("edit, args, expected", [
    (lambda c: c["model"].update(kind="autoencoder"), [],
     "--target must be an LSTM language-model run (configs/lstm_lm.py), not model.family='lstm' with "
     "model.kind='autoencoder'"),
    (lambda c: c["model"].update(family="gpt"), [], "--target must be an LSTM language-model run"),
    (lambda c: c["model"].update(projection_dim=32), [],
     "the two LSTM LM runs' model blocks differ in ['projection_dim']; pretrain both from one configs/lstm_lm.py preset"),
    (lambda c: c["data"].update(vocab="/elsewhere/vocab.txt"), [], "the two LSTM LM runs have different data.vocab"),
    (lambda c: None, ["--n_layers", "1"], "model.n_layers=1 with model.lm_layers=1: each side is the LM's layers"),
])
def test_combine_refuses_in_one_line(runs, tmp_path, capsys, edit, args, expected):
    target = _edited(runs[1], tmp_path, "target", edit)
    argv = ["--source", str(runs[0]), "--target", str(target), "--to", str(tmp_path / "out"), *args]
    assert combine.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertology.families.lstm2lstm.combine: error: "), lines
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
