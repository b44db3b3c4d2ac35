"""The BiLSTM task encoders (GLUE's baselines over a trunk's states, `models/task_encoders.py`): a
pair's sentences are encoded apart (neither padding, the other sentence nor where the sentence
sits in its row changes its vector), the classifier reads [u; v; |u − v|; u ∘ v] ([u; 0; 0; 0]
for one sentence), the attention step is numpy's masked softmax, and only with attention does
one sentence's vector read the other's words."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertology import validation
from bertology.errors import UserError
from bertology.models import task_encoders
from bertology.models.task_encoders import Settings, TaskEncoder
from bertology.train.finetune import default_config

D, H, L = 6, 5, 12


def settings(attention: bool) -> Settings:
    return Settings(attention=attention, hidden_size=H, num_layers=2, classifier_hidden_size=7, dropout_rate=0.0)


def rows(rng, la: int = 4, lb: int = 3):
    """Row 0: sentence A then B (segments 0, 1); row 1: A alone; row 2: B alone, two pads ahead of
    it in the layout of a left-padded trunk; every other position holds its own noise."""
    a, b = rng.normal(size=(la, D)), rng.normal(size=(lb, D))
    x = rng.normal(size=(3, L, D)) * 10  # what a padded position holds must not matter
    mask, segments = np.zeros((3, L), np.int32), np.zeros((3, L), np.int32)
    x[0, :la], x[0, la:la + lb], mask[0, :la + lb], segments[0, la:la + lb] = a, b, 1, 1
    x[1, :la], mask[1, :la] = a, 1
    x[2, 2:2 + lb], mask[2, 2:2 + lb] = b, 1
    return jnp.asarray(x, jnp.float32), jnp.asarray(mask), jnp.asarray(segments)


def features(attention: bool, x, mask, segments, params=None):
    """(the classifier's input [u; v; |u − v|; u ∘ v] of each row, params)."""
    model = TaskEncoder(settings(attention))
    call = dict(per_token=False, deterministic=True)
    params = params or model.init(jax.random.key(0), x, mask, segments, **call)["params"]
    _, state = model.apply({"params": params}, x, mask, segments, **call, mutable=["intermediates"])
    return np.asarray(state["intermediates"]["features"][0]), params


@pytest.mark.parametrize("attention", [False, True])
def test_a_sentence_vector_ignores_padding_position_and_without_attention_the_other_sentence(attention):
    x, mask, segments = rows(np.random.default_rng(0))
    f, _ = features(attention, x, mask, segments)
    u, v, diff, prod = np.split(f, 4, axis=1)
    assert np.abs(u[0]).max() > 1e-3 and np.abs(v[0]).max() > 1e-3
    np.testing.assert_allclose(diff[0], np.abs(u[0] - v[0]), atol=1e-6)
    np.testing.assert_allclose(prod[0], u[0] * v[0], atol=1e-6)
    for single in (1, 2):  # one sentence: [u; 0; 0; 0]
        assert (f[single, 2 * H:] == 0).all()
    if attention:  # each sentence read the other's words: alone, it has other vectors
        assert np.abs(u[0] - u[1]).max() > 1e-3 and np.abs(v[0] - u[2]).max() > 1e-3
    else:  # the pair's sentences are the sentences alone, wherever they sit
        np.testing.assert_allclose(u[0], u[1], atol=1e-5)
        np.testing.assert_allclose(v[0], u[2], atol=1e-5)


def test_attention_is_the_masked_softmax_over_the_other_sentences_words():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 5, D)).astype(np.float32), rng.normal(size=(2, 4, D)).astype(np.float32)
    lengths = np.array([3, 0])
    got = np.asarray(task_encoders.attend(jnp.asarray(a), jnp.asarray(b), jnp.asarray(lengths)))
    scores = a[0] @ b[0, :3].T
    weights = np.exp(scores - scores.max(1, keepdims=True))
    np.testing.assert_allclose(got[0], (weights / weights.sum(1, keepdims=True)) @ b[0, :3], atol=1e-5)
    assert (got[1] == 0).all()  # nothing to attend to


def test_max_pool_reads_each_rows_real_states_only():
    x = np.random.default_rng(2).normal(size=(3, 4, 2)).astype(np.float32)
    got = np.asarray(task_encoders.max_pool(jnp.asarray(x), jnp.asarray([4, 2, 0])))
    np.testing.assert_array_equal(got, np.stack([x[0].max(0), x[1, :2].max(0), np.zeros(2)]))


def test_token_states_stay_at_their_positions():
    """A token head reads the BiLSTM's state at each position: the same sentence right- or
    left-padded gives the same states at its tokens and zeros elsewhere."""
    rng = np.random.default_rng(3)
    sentence = rng.normal(size=(5, D))
    x = rng.normal(size=(2, L, D)) * 10
    x[0, :5], x[1, L - 5:] = sentence, sentence
    mask = np.zeros((2, L), np.int32)
    mask[0, :5], mask[1, L - 5:] = 1, 1
    model = TaskEncoder(settings(False))
    args = (jnp.asarray(x, jnp.float32), jnp.asarray(mask), jnp.zeros((2, L), jnp.int32))
    params = model.init(jax.random.key(0), *args, per_token=True, deterministic=True)["params"]
    out = np.asarray(model.apply({"params": params}, *args, per_token=True, deterministic=True))
    assert out.shape == (2, L, 2 * H)
    np.testing.assert_allclose(out[0, :5], out[1, L - 5:], atol=1e-5)
    assert (out[0, 5:] == 0).all() and (out[1, :L - 5] == 0).all()


def test_the_config_block_names_the_encoder():
    c = default_config("sst2")
    c.task_encoder.update(name="bilstm_attn", hidden_size=8, num_layers=1, classifier_hidden_size=4, dropout_rate=0.1)
    assert task_encoders.settings(c.task_encoder) == Settings(True, 8, 1, 4, 0.1)
    c.task_encoder.name = "none"
    assert task_encoders.settings(c.task_encoder) is None
    c.task_encoder.name = "lstm"
    with pytest.raises(UserError, match=r"^task_encoder.name='lstm' is not one of 'none', 'bilstm', 'bilstm_attn'; "
                                        r"set --config.task_encoder.name to one of"):
        validation.check(c)
