"""Transformer-XL and XLNet trained end to end through the pretraining loop on the embedded corpus:
the contiguous LM lanes continue one token stream, both families' losses fall, a run killed
after a checkpoint and resumed equals an uninterrupted one, losses and carried memory, and one
device equals eight (the memory's rows sharded over them like the batch's)."""

import pathlib
import shutil

import flax.linen as nn
import helpers
import jax
import ml_collections
import numpy as np
import pytest

from bertology.data import lanes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.data.transforms import make
from bertology.errors import UserError


def test_contiguous_lm_lanes_continue_one_stream_with_next_token_targets():
    tok = load_tokenizer(BYTE_BPE_VOCAB)
    rng = np.random.default_rng(0)
    docs = [[rng.integers(5, 300, n) for n in rng.integers(0, 9, 3)] for _ in range(40)] + [[np.zeros(0, int)]]
    transform = make(ml_collections.ConfigDict({"objective": "contiguous_lm", "max_seq_length": 5}), tok)
    assert transform.contiguous
    out = transform.instances(docs, np.random.default_rng(1), 3)
    # the stream as the reference builds it: each document's sentences then eos, empty ones dropped
    stream = np.concatenate([np.concatenate([*d, [tok.eos_id]]) for d in docs if sum(map(len, d))])
    offset = lanes.cut({"i": np.arange(len(stream))}, 3, 5, np.random.default_rng(1))["i"]
    ids, targets, weights = out["input_ids"], out["targets"], out["target_weights"]
    assert ids.shape == targets.shape == weights.shape == offset.shape and ids.dtype == np.int32
    np.testing.assert_array_equal(ids, stream[offset])
    # every token predicts the next of the stream, across sentences, documents and segments
    np.testing.assert_array_equal(targets, stream[offset + 1])
    assert (weights == 1.0).all()
    lane = ids.reshape(3, -1)
    np.testing.assert_array_equal(lane[0, 1:], stream[offset[0, 0, 0] + 1: offset[0, 0, 0] + lane.shape[1]])


def _run(name: str, workdir: pathlib.Path, steps: int, *, length: int = 32, mesh: tuple = (-1, 1), **model) -> dict:
    """A small `name` run on the embedded corpus: segments of `length` tokens, 8 lanes, checkpoint
    at half, on all 8 simulated devices unless `mesh` says otherwise."""
    from bertology.train.loop import train

    c = helpers.config(name, "tiny")
    c.update(batch_size=8, total_steps=steps, log_every=1, eval_every=0, checkpoint_every=steps // 2, seed=3)
    c.mesh.shape = mesh
    c.model.update(num_layers=1, hidden_size=64, num_heads=2, intermediate_size=128, max_position_embeddings=length,
                   **model)
    c.data.max_seq_length = length
    if name == "xlnet":
        half = length // 2
        c.data.update(reuse_len=half, perm_size=half, num_predict=6)
        c.model.reuse_len = half
    c.optimizer.update(learning_rate=3e-3, warmup_steps=3)
    return train(c, workdir)


SETTINGS = {"transfo_xl": dict(mem_len=32), "xlnet": dict(mem_len=24)}


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def whole(request, tmp_path_factory):
    """(family, workdir, result) of one uninterrupted 24-step run."""
    root = tmp_path_factory.mktemp(request.param)
    return request.param, root, _run(request.param, root / "whole", 24, **SETTINGS[request.param])


def test_loss_falls_on_embedded_corpus(whole):
    name, _, result = whole
    losses = [h["lm_loss"] for h in result["history"]]
    assert losses[0] > np.log(8192) - 0.5  # near uniform over the 8k vocabulary at the start
    assert np.mean(losses[-4:]) < losses[0] - 0.5, losses


def test_killed_run_resumes_exactly_with_its_memory(whole):
    """The run killed after its checkpoint at step 12 (its later checkpoint removed) and rerun
    gives the losses and memory of the uninterrupted run."""
    name, root, result = whole
    shutil.copytree(root / "whole", root / "killed")
    shutil.rmtree(root / "killed" / "checkpoints" / "24")
    second = _run(name, root / "killed", 24, **SETTINGS[name])
    assert [h["step"] for h in second["history"]] == list(range(13, 25))
    assert [h["loss"] for h in second["history"]] == [h["loss"] for h in result["history"][12:]]
    carry, expected = jax.device_get(second["state"]["carry"]), jax.device_get(result["state"]["carry"])
    jax.tree.map(np.testing.assert_array_equal, carry, expected)
    assert np.abs(expected["memory"]).max() > 0 and expected["memory_mask"].all()  # memory was carried


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_one_device_and_eight_devices_agree(name, tmp_path):
    """The same short run on mesh (1, 1) and (8, 1), one lane per device on eight: the losses agree
    step by step and so does the memory carried at the end (dropout on: its masks do not depend on
    how the rows are sharded)."""
    runs = {mesh: _run(name, tmp_path / str(mesh), 4, length=16, mesh=mesh, **SETTINGS[name])
            for mesh in [(1, 1), (8, 1)]}
    one, eight = ([h["loss"] for h in runs[m]["history"]] for m in [(1, 1), (8, 1)])
    assert len(one) == 4
    np.testing.assert_allclose(eight, one, rtol=2e-4)
    carry_one, carry_eight = (jax.device_get(runs[m]["state"]["carry"]) for m in [(1, 1), (8, 1)])
    np.testing.assert_allclose(carry_eight["memory"], carry_one["memory"], rtol=2e-4, atol=2e-5)
    np.testing.assert_array_equal(carry_eight["memory_mask"], carry_one["memory_mask"])
    assert carry_one["memory_mask"].all() and np.abs(carry_one["memory"]).max() > 0


def test_xlnet_summary_is_the_last_token_and_left_padding_leaves_it_unchanged():
    """What fine-tuning reads from XLNet (`xlnet.task_trunk`: `sequence`, `pooled`): padding on the
    left, as the reference fine-tunes, moves no real token's relative distances, so the summary of
    `<cls>` (the last position) and every real position read the same as the unpadded row."""
    from bertology import models
    from bertology.families.xlnet import model as xlnet

    c = helpers.config("xlnet", "tiny")
    c.model.update(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=50)
    trunk = xlnet.task_trunk(models.encoder_config(c.model), "encoder")
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 50, (1, 7)).astype(np.int32)
    segments = np.array([[0, 0, 0, 1, 1, 1, 2]], np.int32)
    pad = 5
    padded = {"input_ids": np.concatenate([np.zeros((1, pad), np.int32), ids], 1),
              "segment_ids": np.concatenate([np.full((1, pad), 4, np.int32), segments], 1),
              "input_mask": np.concatenate([np.zeros((1, pad), np.int32), np.ones_like(ids)], 1)}
    params = nn.meta.unbox(trunk.init(jax.random.PRNGKey(0), padded)["params"])
    short = trunk.apply({"params": params}, {"input_ids": ids, "segment_ids": segments, "input_mask": np.ones_like(ids)})
    long = trunk.apply({"params": params}, padded)
    np.testing.assert_allclose(long["pooled"], short["pooled"], atol=1e-5)
    np.testing.assert_allclose(long["pooled"], np.tanh(long["sequence"][:, -1] @ params["summary"]["kernel"]
                                                       + params["summary"]["bias"]), atol=1e-5)
    np.testing.assert_allclose(long["sequence"][:, pad:], short["sequence"], atol=1e-5)
    assert len(long["layers"]) == 3 and long["layers"][-1] is long["sequence"]
    # the summary reads the whole row: another first token changes it
    changed = padded["input_ids"].copy()
    changed[0, pad] = ids[0, 0] % 49 + 1
    other = trunk.apply({"params": params}, {**padded, "input_ids": changed})
    assert np.abs(other["pooled"] - long["pooled"]).max() > 1e-4


def test_without_memory_the_run_keeps_no_carry_and_checkpoints(tmp_path):
    """mem_len 0 (the baseline of the memory's effect): nothing is carried, so the train state
    has no carry and its checkpoints hold no empty arrays."""
    result = _run("transfo_xl", tmp_path, 4, mem_len=0)
    assert "carry" not in result["state"] and sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "4"]
    # a Transformer-XL run has no fine-tuning trunk: fine-tuning and features refuse it in one line, by that reason
    from bertology.features import extract
    from bertology.train.finetune import finetune

    c = helpers.config("finetune/embedded")
    c.init_checkpoint = str(tmp_path)
    for attempt in (lambda: finetune(c, tmp_path / "ft"), lambda: extract(tmp_path, ["a sentence"])):
        with pytest.raises(UserError, match="^a transfo_xl run has no fine-tuning trunk: "):
            attempt()


def test_xlnet_trunk_of_shared_biases_computes_the_pretrained_network():
    """`xlnet.trunk` copies shared r_w/r_r/r_s biases (untie_r=False) into every layer: the
    fine-tuning trunk on them gives the pretraining model's content stream (read through the tied
    output layer, compared with the model's logits without targets)."""
    from bertology import models
    from bertology.families.xlnet import model as xlnet

    c = helpers.config("xlnet", "tiny")
    c.model.update(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=50, untie_r=False,
                   mem_len=0, reuse_len=0, bi_data=False, dropout_rate=0.0)
    model = models.build(c.model)
    rng = np.random.default_rng(1)
    batch = {"input_ids": rng.integers(3, 50, (2, 9)).astype(np.int32), "input_mask": np.ones((2, 9), np.int32),
             "segment_ids": np.array([[0] * 4 + [1] * 4 + [2]] * 2, np.int32)}
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)["params"])
    assert "biases" in params and "biases" not in params["attention_0"]
    cfg, trunk = models.pretrained_encoder(params, c.model)
    task = xlnet.task_trunk(cfg, "encoder")
    fresh = nn.meta.unbox(task.init(jax.random.PRNGKey(1), batch)["params"])
    out = task.apply({"params": {**trunk, "summary": fresh["summary"]}}, batch)
    table = params["embeddings"]["token"]["embedding"]
    np.testing.assert_allclose(out["sequence"] @ table.T + params["lm_bias"], model.apply({"params": params}, batch)["logits"],
                               atol=1e-4)


def test_xlnet_finetunes_from_its_pretraining_run(tmp_path):
    """configs/finetune/xlnet.py from a tiny XLNet pretraining run: the run's trunk loads into the
    task model with nothing missing or left over (only the summary is new), and the loss falls on
    the SST-2 fixture (as `test_finetune` checks BERT's heads; the embedded task needs ~150 steps
    of 32 for any model, too long here)."""
    from flax.traverse_util import flatten_dict

    from bertology.families.xlnet import model as xlnet
    from bertology.train.checkpoint import load_params
    from bertology.train.finetune import finetune

    _run("xlnet", tmp_path / "pre", 2, mem_len=24, dropout_rate=0.0, attention_dropout_rate=0.0,
         activation_dropout_rate=0.0)
    c = helpers.config("finetune/xlnet", "sst2")
    c.update(init_checkpoint=str(tmp_path / "pre"), total_steps=40, batch_size=8, eval_batch_size=8, log_every=1)
    c.data.update(dir=str(pathlib.Path(__file__).parent / "fixtures" / "glue" / "SST-2"), max_seq_length=48)
    c.optimizer.learning_rate = 3e-3
    c.mesh.shape = (1, 1)
    result = finetune(c, tmp_path / "ft")
    loss = np.array(result["train_loss"])
    assert loss[-5:].mean() < loss[:5].mean() - 0.3, loss
    pretrained = flatten_dict(xlnet.trunk(load_params(tmp_path / "pre")[0]))
    encoder = flatten_dict(result["params"]["encoder"])
    assert set(encoder) - set(pretrained) == {("summary", "kernel"), ("summary", "bias")}
    assert set(pretrained) <= set(encoder)
