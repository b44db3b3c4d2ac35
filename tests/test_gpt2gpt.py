"""GPT2GPT (Ramachandran, Liu & Le 2017, Transformer version): two tiny GPT runs pretrained on the
embedded corpus become one encoder-decoder (`families/gpt2gpt/combine.py`), checked tensor by
tensor; its objective is the seq2seq loss plus both LM losses, checked against the three terms
assembled by hand from the GPT runs' own networks; and it fine-tunes on the embedded seq2seq task
with a falling held-out loss. The GPT runs and the combined run are built once per module."""

import helpers
import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from bertology import models, objectives
from bertology.families.gpt import model as gpt
from bertology.families.gpt2gpt import combine
from bertology.families.gpt2gpt.model import Model
from bertology.train import loop
from bertology.train.checkpoint import load_params
from bertology.train.finetune import finetune

SOURCE, TARGET = 24, 12  # row lengths of the seq2seq rows here


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(source GPT, target GPT, combined run) directories: two tiny GPTs, 12 steps each from
    different seeds, and the GPT2GPT made of them."""
    root = tmp_path_factory.mktemp("gpt2gpt")
    for seed, name in enumerate(("source", "target")):
        c = helpers.config("gpt", "tiny")
        c.update(seed=seed, total_steps=12, batch_size=8, log_every=4, eval_every=0, checkpoint_every=1000)
        c.data.max_seq_length = 32
        c.mesh.shape = (1, 1)
        loop.train(c, root / name)
    return helpers.combined_runs(combine.main, root)


@pytest.fixture(scope="module")
def rows(runs):
    """Seq2seq rows of 6 validation examples of the embedded task, the decoder starting at EOS."""
    return helpers.embedded_seq2seq_rows(runs[2], 6, SOURCE, TARGET)


def gpt_logits(params, ids, mask, block):
    """The GPT run's own next-token logits (its own network, `gpt.Model`)."""
    gpt_block = {**{k: v for k, v in block.items() if k != "causal_encoder"}, "family": "gpt"}
    return np.asarray(gpt.Model(models.encoder_config(gpt_block)).apply(
        {"params": params}, {"input_ids": ids, "input_mask": mask})["logits"], np.float64)


def nll(logits, targets, weights):
    """Weighted mean token cross-entropy, in float64."""
    top = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    label = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float(((logz - label) * weights).sum() / weights.sum())


def test_encoder_and_decoder_are_the_two_gpt_runs_and_cross_attention_is_fresh(runs):
    (source, _), (target, _), (params, config) = (load_params(r) for r in runs)
    assert config["model"]["family"] == "gpt2gpt" and config["model"]["causal_encoder"] is True
    enc, dec = flatten_dict(params["encoder"]), flatten_dict(params["decoder"])
    src, tgt = flatten_dict(source["decoder"]), flatten_dict(target["decoder"])
    assert set(enc) == set(src)
    for k in src:
        np.testing.assert_array_equal(enc[k], src[k], err_msg=str(k))
    cross = {k for k in dec if k[0].startswith("cross_attention_")}
    assert {k[0] for k in cross} == {"cross_attention_0", "cross_attention_1"} and set(dec) - cross == set(tgt)
    for k in tgt:
        np.testing.assert_array_equal(dec[k], tgt[k], err_msg=str(k))
    # fresh: exactly the core's initialisation (seed 0), not a copy of either run's self-attention
    fresh = flatten_dict(combine.fresh_params(config["model"])["decoder"])
    for k in cross:
        np.testing.assert_array_equal(dec[k], fresh[k], err_msg=str(k))
    own = ("attention_0", "query", "kernel")
    assert not np.allclose(dec[("cross_attention_0",) + own[1:]], tgt[own])
    # the two runs differ, so an encoder and decoder taken from the wrong runs would fail above
    assert not np.allclose(src[("embeddings", "token", "embedding")], tgt[("embeddings", "token", "embedding")])


def test_combined_loss_is_the_sum_of_the_three_terms(runs, rows):
    """Seq2seq NLL (the model's logits) + 0.3 x the source GPT's LM loss over the source + 0.7 x
    the target GPT's LM loss over the targets, both from the GPT runs' own networks."""
    (source, _), (target, _), (params, config) = (load_params(r) for r in runs)
    block = config["model"]
    model = models.build(block)
    logits = np.asarray(model.apply({"params": params}, rows)["logits"], np.float64)
    seq2seq = nll(logits, rows["targets"], rows["target_weights"])
    src_logits = gpt_logits(source, rows["input_ids"], rows["input_mask"], block)
    source_lm = nll(src_logits[:, :-1], rows["input_ids"][:, 1:], rows["input_mask"][:, 1:])
    tgt_logits = gpt_logits(target, rows["decoder_input_ids"], rows["decoder_input_mask"], block)
    target_lm = nll(tgt_logits, rows["targets"], rows["target_weights"])
    combined = objectives.get({"name": "gpt2gpt", "source_lm_weight": 0.3, "target_lm_weight": 0.7})
    loss, metrics = jax.jit(lambda p: combined(p, rows, None, model))(params)
    assert float(loss) == pytest.approx(seq2seq + 0.3 * source_lm + 0.7 * target_lm, rel=1e-5)
    assert float(metrics["source_lm_loss"]) == pytest.approx(source_lm, rel=1e-5)
    plain, _ = objectives.get({"name": "gpt2gpt", "source_lm_weight": 0.0, "target_lm_weight": 0.0})(
        params, rows, None, model)
    assert float(plain) == pytest.approx(seq2seq, rel=1e-5)


def test_decoder_without_cross_attention_is_the_target_gpt(runs, rows):
    """The decoder's LM pass (cross-attention off) gives the target GPT's logits on the same
    tokens, and so its LM loss; the seq2seq pass (cross-attention on) does not. The causal
    encoder computes the source GPT's logits too."""
    (source, _), (target, _), (params, config) = (load_params(r) for r in runs)
    block = config["model"]
    model = models.build(block)
    ours = np.asarray(model.apply({"params": params}, rows, method=Model.target_lm), np.float64)
    theirs = gpt_logits(target, rows["decoder_input_ids"], rows["decoder_input_mask"], block)
    real = rows["decoder_input_mask"] > 0
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4)
    assert nll(ours, rows["targets"], rows["target_weights"]) == pytest.approx(
        nll(theirs, rows["targets"], rows["target_weights"]), rel=1e-6)
    seq2seq = np.asarray(model.apply({"params": params}, rows)["logits"], np.float64)
    assert np.abs(seq2seq[real] - theirs[real]).max() > 1e-2  # the source does reach the decoder
    encoded = np.asarray(model.apply({"params": params}, rows, method=Model.source_lm), np.float64)
    src = rows["input_mask"] > 0
    np.testing.assert_allclose(encoded[src], gpt_logits(source, rows["input_ids"], rows["input_mask"], block)[src],
                               atol=1e-4)


def test_gpt2gpt_fine_tunes_on_the_embedded_task(runs, rows, tmp_path):
    config = helpers.config("gpt2gpt", "embedded")
    config.update(init_checkpoint=str(runs[2]), total_steps=16, batch_size=8, log_every=4, eval_examples=2,
                  eval_batch_size=2)
    config.data.update(max_seq_length=SOURCE, max_target_length=TARGET)
    config.generation.max_new_tokens = 3
    config.mesh.shape = (1, 1)
    results = finetune(config, tmp_path / "run")
    assert len(results["train_loss"]) == 4 and results["train_loss"][-1] < results["train_loss"][0]
    params, run_config = load_params(runs[2])
    model = models.build(run_config["model"])
    held_out = jax.jit(lambda p: objectives.get({"name": "gpt2gpt", "source_lm_weight": 0.0, "target_lm_weight": 0.0})(
        p, rows, None, model)[0])
    before, after = float(held_out(params)), float(held_out(results["params"]))
    assert after < before - 0.5, (before, after)
