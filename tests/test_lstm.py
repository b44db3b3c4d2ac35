"""The LSTM baselines of Dai & Le 2015 (families/lstm/model.py, configs/lstm_lm.py, configs/seq_autoencoder.py).

References: PyTorch's `nn.LSTM(proj_size=...)` on the same weights (gates reordered, TF's forget
bias folded into the bias), the autoencoder's decoder against the same stack scanned over the
unpadded [sentence, decoder inputs] of each row, the CLI's training runs on the embedded corpus,
and an uninterrupted run for resume.
"""

import json
import shutil

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertology import models, objectives, pretrain
from bertology.errors import UserError
from bertology.families.lstm import model as lstm
from bertology.train.checkpoint import load_params

TINY = dict(family="lstm", vocab_size=29, projection_dim=8, lstm_dim=12, n_layers=2, use_skip_connections=True,
            dropout_rate=0.0)


def _params(model, batch, seed=0):
    return model.init(jax.random.PRNGKey(seed), batch)["params"]


def _torch_lm_loss(params, ids, targets, weights, carry):
    """The LM's weighted next-word cross-entropy and final states, computed by torch.nn.LSTM
    (float64) layer by layer with the residual between layers, tied softmax plus bias."""
    torch = pytest.importorskip("torch")
    p = jax.tree.map(lambda a: torch.tensor(np.asarray(a, np.float64)), params)
    d, proj = TINY["lstm_dim"], TINY["projection_dim"]
    order = torch.cat([torch.arange(k * d, (k + 1) * d) for k in (0, 2, 1, 3)])  # TF i,j,f,o -> torch i,f,g,o
    x = p["embed"]["embedding"][torch.tensor(ids, dtype=torch.long)]
    finals_h, finals_c = [], []
    for k in range(TINY["n_layers"]):
        kernel, bias = p["lstm"][f"layer_{k}_kernel"], p["lstm"][f"layer_{k}_bias"].clone()
        bias[2 * d:3 * d] += 1.0  # TF LSTMCell's forget bias
        cell = torch.nn.LSTM(x.shape[-1], d, proj_size=proj, batch_first=True).double()
        with torch.no_grad():
            cell.weight_ih_l0.copy_(kernel[:x.shape[-1]].T[order])
            cell.weight_hh_l0.copy_(kernel[x.shape[-1]:].T[order])
            cell.bias_ih_l0.copy_(bias[order])
            cell.bias_hh_l0.zero_()
            cell.weight_hr_l0.copy_(p["lstm"][f"layer_{k}_projection"].T)
            h0 = torch.tensor(np.asarray(carry["h"][:, k], np.float64))[None]
            c0 = torch.tensor(np.asarray(carry["c"][:, k], np.float64))[None]
            out, (h, c) = cell(x, (h0, c0))
        x = out + x if k > 0 else out
        finals_h.append(h[0])
        finals_c.append(c[0])
    logits = x @ p["embed"]["embedding"].T + p["output_bias"]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(targets, dtype=torch.long).reshape(-1),
                                            reduction="none").reshape(targets.shape)
    w = torch.tensor(weights, dtype=torch.float64)
    loss = (nll * w).sum() / (w.sum() + 1e-5)  # mlm_means' convention
    return loss.item(), torch.stack(finals_h, 1).numpy(), torch.stack(finals_c, 1).numpy()


def test_lm_loss_and_carry_equal_torch_nn_lstm():
    rng = np.random.default_rng(0)
    b, length = 3, 7
    ids = rng.integers(0, TINY["vocab_size"], (b, length)).astype(np.int32)
    targets = rng.integers(0, TINY["vocab_size"], (b, length)).astype(np.int32)
    weights = (rng.random((b, length)) > 0.2).astype(np.float32)
    carry = {"c": rng.normal(size=(b, 2, 12)).astype(np.float32), "h": rng.normal(size=(b, 2, 8)).astype(np.float32)}
    batch = {"input_ids": ids, "targets": targets, "target_weights": weights, "carry": carry}
    model = models.build(TINY)
    params = _params(model, batch)
    params["output_bias"] = jnp.asarray(rng.normal(size=TINY["vocab_size"]), jnp.float32)  # exercised, not zeros
    terms = objectives.get("transfo_xl").terms(params, batch, None, model)
    ref_loss, ref_h, ref_c = _torch_lm_loss(params, ids, targets, weights, carry)
    np.testing.assert_allclose(float(terms.loss_value()), ref_loss, rtol=1e-5)
    np.testing.assert_allclose(terms.carry["h"], ref_h, atol=1e-5)
    np.testing.assert_allclose(terms.carry["c"], ref_c, atol=1e-5)
    zero = jax.tree.map(np.zeros_like, carry)  # the carry is read: from zero states the loss differs
    assert abs(float(objectives.get("transfo_xl").terms(params, {**batch, "carry": zero}, None, model).loss_value())
               - ref_loss) > 1e-3


def test_autoencoder_decoder_continues_the_scan_over_the_sentence():
    rng = np.random.default_rng(1)
    cfg = lstm.config({**TINY, "kind": "autoencoder"})
    length, n = 6, np.array([6, 3])
    source = rng.integers(5, cfg.vocab_size, (2, length)).astype(np.int32)
    mask = (np.arange(length)[None] < n[:, None]).astype(np.int32)
    source = np.where(mask == 1, source, 0)
    targets = source.copy()
    decoder = np.where(mask == 1, np.concatenate([np.full((2, 1), 3), targets[:, :-1]], 1), 0).astype(np.int32)
    batch = {"input_ids": source, "input_mask": mask, "decoder_input_ids": decoder, "decoder_input_mask": mask,
             "targets": targets, "target_weights": mask.astype(np.float32)}
    model = lstm.Model(cfg)
    params = _params(model, batch)
    logits = model.apply({"params": params}, batch)["logits"]
    assert logits.shape == (2, length, cfg.vocab_size)
    for r in range(2):  # one unpadded scan over [sentence, decoder inputs]: logits at the decoder's part
        ids = np.concatenate([source[r, :n[r]], decoder[r, :n[r]]])[None]
        top = model.apply({"params": params}, jnp.asarray(ids), True, method=lambda m, i, d: m.read(i, d)[0][-1])
        ref = top[0, n[r]:] @ params["embed"]["embedding"].T + params["output_bias"]
        np.testing.assert_allclose(logits[r, :n[r]], ref, atol=1e-5)
    # the decoder reads the encoder: its first prediction moves when the sentence's first word does
    moved = source.copy()
    moved[:, 0] = (moved[:, 0] + 1) % cfg.vocab_size
    again = model.apply({"params": params}, {**batch, "input_ids": moved})["logits"]
    assert np.abs(np.asarray(again - logits)[:, 0]).max() > 1e-4


def test_trunk_pools_the_last_real_token_and_ignores_right_padding():
    cfg = lstm.config(TINY)
    rng = np.random.default_rng(2)
    ids = rng.integers(5, cfg.vocab_size, (2, 7)).astype(np.int32)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
    trunk = lstm.task_trunk(cfg, "encoder")
    params = _params(trunk, {"input_ids": ids, "input_mask": mask})
    out = trunk.apply({"params": params}, {"input_ids": ids, "input_mask": mask})
    assert out["sequence"].shape == (2, 7, 8) and out["pooled"].shape == (2, 8)
    assert [x.shape for x in out["layers"]] == [(2, 7, 8)] * 3
    np.testing.assert_array_equal(out["layers"][0], params["embed"]["embedding"][ids])
    # row 1 alone, unpadded: its last output is the pooled vector; what the padding holds changes nothing
    alone = trunk.apply({"params": params}, {"input_ids": ids[1:, :4], "input_mask": mask[1:, :4]})
    np.testing.assert_allclose(out["pooled"][1], alone["sequence"][0, -1], atol=1e-6)
    np.testing.assert_allclose(out["pooled"][0], out["sequence"][0, -1], atol=0)
    repadded = trunk.apply({"params": params}, {"input_ids": np.where(mask == 1, ids, 7), "input_mask": mask})
    np.testing.assert_array_equal(repadded["pooled"], out["pooled"])


def test_unknown_kind_or_key_is_one_line():
    with pytest.raises(UserError, match="model.kind='bilm' is not an LSTM baseline"):
        lstm.config({**TINY, "kind": "bilm"})
    with pytest.raises(UserError, match=r"unknown LSTM model key\(s\) \['hidden_size'\]"):
        lstm.config({**TINY, "hidden_size": 8})


def _train(workdir, config, steps, **overrides):
    from bertology.train.loop import train

    config.model.update(projection_dim=16, lstm_dim=24)
    config.update(batch_size=8, total_steps=steps, log_every=1, eval_every=0, checkpoint_every=3, seed=3)
    config.data.max_seq_length = 6
    config.update(overrides)
    return train(config, workdir)


def test_lm_resumes_exactly_with_its_lstm_states(tmp_path):
    """A run killed after its checkpoint at step 3 (its later checkpoint removed) and rerun gives
    the losses and LSTM states of one uninterrupted run."""
    whole = _train(tmp_path / "whole", helpers.config("lstm_lm", "tiny"), 6)
    shutil.copytree(tmp_path / "whole", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "6")
    second = _train(tmp_path / "killed", helpers.config("lstm_lm", "tiny"), 6)
    assert [h["step"] for h in second["history"]] == [4, 5, 6]
    assert [h["loss"] for h in second["history"]] == [h["loss"] for h in whole["history"][3:]]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(second["state"]["carry"]),
                 jax.device_get(whole["state"]["carry"]))
    assert np.abs(jax.device_get(whole["state"]["carry"]["h"])).max() > 0  # states were carried
    # the checkpoint's trunk is exactly what the classifier's encoder takes
    params, pre = load_params(tmp_path / "whole")
    cfg, encoder = models.pretrained_encoder(params, pre["model"])
    ids = np.array([[5, 9, 11, 0]], np.int32)
    inputs = {"input_ids": ids, "input_mask": (ids > 0).astype(np.int32)}
    trunk = lstm.task_trunk(cfg, "encoder")
    fresh = _params(trunk, inputs)
    assert jax.tree.map(np.shape, fresh) == jax.tree.map(np.shape, encoder)
    out = trunk.apply({"params": encoder}, inputs)
    model = lstm.Model(cfg)
    full = model.apply({"params": params}, jnp.asarray(ids[:, :3]), True, method=lambda m, i, d: m.read(i, d)[0])
    np.testing.assert_allclose(out["pooled"][0], full[-1][0, 2], atol=1e-6)


def _learns(config_path, tmp_path):
    status = pretrain.main(["pretrain", "--config", config_path, "--workdir", str(tmp_path),
                            "--config.total_steps=30", "--config.batch_size=16", "--config.log_every=10",
                            "--config.eval_every=0", "--config.checkpoint_every=30"])
    assert status == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [r["perplexity"] for r in rows if "perplexity" in r]


@pytest.mark.optimized
def test_tiny_lm_learns_on_embedded_corpus(tmp_path):
    ppl = _learns("configs/lstm_lm.py:tiny", tmp_path)
    assert ppl[0] > 2000  # near uniform over the 4k-word vocabulary at the start
    assert ppl[-1] < 0.25 * ppl[0]


@pytest.mark.optimized
def test_tiny_autoencoder_learns_on_embedded_corpus(tmp_path):
    ppl = _learns("configs/seq_autoencoder.py:tiny", tmp_path)
    assert ppl[0] > 2000
    assert ppl[-1] < 0.25 * ppl[0]


def test_flops_count_the_lstm_matmuls_and_the_tied_softmax():
    c = helpers.config("lstm_lm", "tiny")
    c.model.update(vocab_size=100, n_layers=1, projection_dim=4, lstm_dim=6)
    # [x, h] @ W (x and h 4-wide, 4 gates of 6), the 6 -> 4 projection, the 4 -> 100 softmax; x3 to train
    assert models.flops_per_token(c) == 3 * (2 * 8 * 24 + 2 * 6 * 4 + 2 * 4 * 100)
    c.model.kind = "autoencoder"  # reads each word twice (encoder, decoder), predicts it once
    assert models.flops_per_token(c) == 3 * (2 * (2 * 8 * 24 + 2 * 6 * 4) + 2 * 4 * 100)
