"""The LSTM LM as a fine-tuning initialisation (Dai & Le 2015's LM-LSTM): `bertology.finetune`
takes a `configs/lstm_lm.py` run's token table and LSTM whole, trains all of it with the
classification head on the last real token's state, and the Transformer-only checks stay out of
its way."""

import pathlib

import helpers
import jax
import numpy as np
import pytest
from helpers import _two_topic_sst2  # a topic task in the embedded word vocabulary

from bertology.errors import UserError
from bertology.families.lstm import model as lstm
from bertology.train.checkpoint import load_params
from bertology.train.finetune import default_config, finetune
from bertology.train.loop import train


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A tiny stateful LSTM-LM run on the embedded corpus (6 steps)."""
    root = tmp_path_factory.mktemp("lstm_lm") / "run"
    c = helpers.config("lstm_lm", "tiny")
    c.model.update(projection_dim=16, lstm_dim=24)
    c.update(batch_size=8, total_steps=6, log_every=3, eval_every=0, checkpoint_every=6, seed=3)
    c.data.max_seq_length = 8
    c.mesh.shape = (1, 1)
    train(c, root)
    return root


def _config(lm_run: pathlib.Path, data: pathlib.Path, **overrides):
    """An SST-2-layout topic task (files vs numbers) read by the checkpoint's word vocabulary."""
    c = default_config("sst2")
    c.update(init_checkpoint=str(lm_run), batch_size=16, eval_batch_size=16, log_every=1, **overrides)
    c.data.dir = str(_two_topic_sst2(data, load_params(lm_run)[1]["data"]["vocab"]))
    c.data.max_seq_length = 12
    c.mesh.shape = (1, 1)
    return c


def test_step_zero_trunk_is_the_checkpoint(tmp_path, lm_run):
    """One step whose rate is warmup's 0 leaves the start untouched, so the run's parameters are
    what fine-tuning started from: the checkpoint's token table and LSTM, tensor for tensor, plus
    the head (merge_pretrained would stop on a missing tensor; the tree equality rules out extras)."""
    saved, _ = load_params(lm_run)
    c = _config(lm_run, tmp_path / "data", total_steps=1)
    c.optimizer.warmup_steps = 1
    result = finetune(c, tmp_path / "run")
    params = jax.device_get(result["params"])
    assert set(params) == {"encoder", "head"}
    trunk = lstm.trunk(saved)
    assert jax.tree.structure(params["encoder"]) == jax.tree.structure(trunk)
    jax.tree.map(np.testing.assert_array_equal, params["encoder"], trunk)
    assert params["head"]["kernel"].shape == (16, 2)  # the last real token's 16-wide state -> the 2 labels


def test_full_finetune_from_the_lm_learns_and_trains_the_lstm(tmp_path, lm_run):
    c = _config(lm_run, tmp_path / "data", total_steps=40)
    c.optimizer.learning_rate = 1e-2
    result = finetune(c, tmp_path / "run")
    losses = result["train_loss"]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.1, losses
    assert result["scores"]["accuracy"] > 80
    saved, _ = load_params(lm_run)
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), jax.device_get(result["params"]["encoder"]),
                         lstm.trunk(saved))
    assert min(jax.tree.leaves(moved)) > 0, moved  # mode=full: the embedding and every LSTM tensor trained


@pytest.mark.parametrize("overrides, message", [
    (dict(mode="adapters"), "the lstm trunk fine-tunes with mode full or features, not adapters; set mode=full"),
    (dict(optimizer=dict(layerwise_lr_decay=0.8)), "layerwise_lr_decay needs a layered Transformer trunk"),
])
def test_transformer_only_options_are_one_line(tmp_path, lm_run, overrides, message):
    c = _config(lm_run, tmp_path / "data", total_steps=1)
    c.update(overrides)
    with pytest.raises(UserError, match=message):
        finetune(c, tmp_path / "run")
