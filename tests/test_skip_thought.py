"""Skip-Thought (Kiros et al. 2015): rows of a sentence and its two neighbours, the decoders'
loss against numpy, decoders that see the sentence only through its vector, a tiny model that
learns to generate the neighbours, and the same vector downstream."""

import sys

import jax
import numpy as np
import optax
import pytest
from helpers import REPO
from scipy.special import log_softmax

from bertology import models, objectives
from bertology.data import transforms
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer

TOK = load_tokenizer(DEFAULT_VOCAB)


def config():
    sys.path.insert(0, str(REPO / "configs"))
    import skip_thought

    c = skip_thought.get_config("tiny")
    c.model.update(vocab_size=TOK.vocab_size, dropout_rate=0.0, attention_dropout_rate=0.0)
    c.data.max_seq_length = 8
    return c


def documents():
    """Two documents of 5 and 2 sentences; sentence k of document d is 3 + k % 3 tokens from 100·(d+1) + 10·k."""
    return [[np.arange(100 * (d + 1) + 10 * k, 100 * (d + 1) + 10 * k + 3 + k % 3, dtype=np.int32) for k in range(n)]
            for d, n in enumerate((5, 2))]


def rows():
    return transforms.make(config().data, TOK).instances(documents(), np.random.default_rng(0))


def test_rows_are_each_sentence_with_its_neighbours():
    r = rows()
    assert r["input_ids"].shape == (3, 8)  # sentences 1, 2, 3 of the first document; the second has no middle
    cls, sep = TOK.cls_id, TOK.sep_id
    assert r["input_ids"][0].tolist() == [cls, 110, 111, 112, 113, sep, 0, 0]
    assert r["previous_ids"][0].tolist() == [100, 101, 102, sep, 0, 0, 0, 0]
    assert r["next_ids"][0].tolist() == [120, 121, 122, 123, 124, sep, 0, 0]
    assert r["next_inputs"][0].tolist() == [cls, 120, 121, 122, 123, 124, 0, 0]  # teacher forcing: shifted right
    assert r["previous_ids"][2].tolist() == [120, 121, 122, 123, 124, sep, 0, 0]
    for side in ("previous", "next"):
        np.testing.assert_array_equal(r[f"{side}_mask"], r[f"{side}_ids"] > 0)


@pytest.fixture(scope="module")
def model_params():
    c = config()
    model = models.build(c.model)
    batch = {k: np.asarray(v) for k, v in rows().items()}
    return model, model.init(jax.random.key(0), batch)["params"], batch


def test_the_loss_is_the_two_decoders_cross_entropy_against_numpy(model_params):
    model, params, batch = model_params
    objective = objectives.get("skip_thought")
    metrics = objective.metrics(objective.terms(params, batch, None, model))
    out = model.apply({"params": params}, batch)
    total = 0.0
    for side in ("previous", "next"):
        logp = log_softmax(np.asarray(out[f"{side}_logits"], np.float64), -1)
        nll = -np.take_along_axis(logp, batch[f"{side}_ids"][..., None], -1)[..., 0]
        w = batch[f"{side}_mask"]
        np.testing.assert_allclose(metrics[f"{side}_loss"], (nll * w).sum() / w.sum(), rtol=1e-5)
        total += (nll * w).sum() / w.sum()
    np.testing.assert_allclose(metrics["loss"], total, rtol=1e-5)


def test_the_decoders_see_the_sentence_through_its_vector_and_are_causal(model_params):
    model, params, batch = model_params
    base = model.apply({"params": params}, batch)
    other = {**batch, "input_ids": batch["input_ids"].copy()}
    other["input_ids"][0, 2] = 500  # another middle sentence
    moved = model.apply({"params": params}, other)
    assert np.abs(np.asarray(moved["previous_logits"][0] - base["previous_logits"][0])).max() > 1e-5  # 5.7e-5 at init
    np.testing.assert_allclose(moved["next_logits"][1:], base["next_logits"][1:], atol=1e-6)  # other rows untouched
    later = {**batch, "next_inputs": batch["next_inputs"].copy()}
    later["next_inputs"][0, 3] = 500  # a later input token moves no earlier prediction
    after = np.asarray(model.apply({"params": params}, later)["next_logits"][0])
    np.testing.assert_allclose(after[:3], np.asarray(base["next_logits"][0])[:3], atol=1e-6)
    assert np.abs(after[3:] - np.asarray(base["next_logits"][0])[3:]).max() > 1e-4
    # Downstream, the fine-tuning trunk (the shared Encoder on the trunk's parameters) pools the same vector.
    from bertology.models.tasks import trunk

    cfg = models.family("skip_thought").trunk_config(config().model)
    pooled = trunk(cfg, "skip_thought").apply({"params": models.family("skip_thought").trunk(params)},
                                              {"input_ids": batch["input_ids"], "input_mask": batch["input_mask"]})["pooled"]
    np.testing.assert_allclose(pooled, base["sentence"], atol=1e-6)


def test_a_tiny_model_learns_to_generate_the_neighbours(model_params):
    model, params, batch = model_params
    objective = objectives.get("skip_thought")
    opt = optax.adam(3e-3)

    @jax.jit
    def step(p, s):
        (loss, terms), g = jax.value_and_grad(lambda p: (lambda t: (objective.metrics(t)["loss"], t))(
            objective.terms(p, batch, None, model)), has_aux=True)(p)
        updates, s = opt.update(g, s)
        return optax.apply_updates(p, updates), s, objective.metrics(terms)

    state, first = opt.init(params), None
    for _ in range(30):
        params, state, metrics = step(params, state)
        first = first or metrics
    assert float(first["next_loss"]) == pytest.approx(np.log(TOK.vocab_size), abs=1.0)  # near uniform at the start
    assert float(metrics["next_loss"]) < 0.3 * float(first["next_loss"])
    assert float(metrics["previous_accuracy"]) > 0.8


@pytest.mark.slow
def test_tiny_skip_thought_trains_on_the_embedded_corpus(tmp_path):
    import json

    from bertology.train.loop import train

    sys.path.insert(0, str(REPO / "configs"))
    import skip_thought

    c = skip_thought.get_config("tiny")
    c.total_steps, c.log_every, c.eval_every, c.checkpoint_every, c.mesh.shape = 20, 1, 0, 1000, (1, 1)
    c.optimizer.warmup_steps = 5
    train(c, tmp_path)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if "learning_rate" in line]
    assert losses[0] == pytest.approx(2 * np.log(TOK.vocab_size), abs=1.0)  # both decoders near uniform
    assert np.mean(losses[-5:]) < losses[0] - 2.0, losses
