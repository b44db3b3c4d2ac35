"""End-to-end pretraining on the embedded corpus: learning, exact resume, multi-device parity."""

import json
import signal
import subprocess
import sys
import time

import helpers
import jax
import numpy as np
import pytest
from helpers import REPO, tiny_config

from bertology import models
from bertology.errors import UserError
from bertology.train.loop import train


def losses(summary, key="loss"):
    return np.array([h[key] for h in summary["history"]])


@pytest.mark.slow
def test_tiny_bert_learns_and_logs(tmp_path):
    out = train(tiny_config(eval_every=50, eval_batches=2), tmp_path)
    mlm = losses(out, "mlm_loss")
    assert mlm[:5].mean() > np.log(8192) - 0.5  # starts near uniform over the 8k vocab
    assert mlm[-5:].mean() < mlm[:5].mean() - 1.5, mlm
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 51))
    assert {"step", "loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"} <= set(train_rows[0])
    assert any("eval_mlm_loss" in r for r in rows)
    # TensorBoard event files hold the same scalars (read back with tensorboardX's protos).
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import RecordWriter  # noqa: F401 (the format's writer exists)

    (event_file,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    data = event_file.read_bytes()
    values, i = {}, 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 8], "little")
        ev = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
        for v in ev.summary.value:
            values.setdefault(v.tag, {})[ev.step] = v.simple_value
        i += 12 + n + 4
    assert values["loss"][50] == pytest.approx(train_rows[-1]["loss"], rel=1e-6)


@pytest.mark.slow
def test_resume_after_sigterm_is_exact(tmp_path):
    """Interrupt a run with SIGTERM mid-way, rerun it, and compare with an uninterrupted run."""
    cfg = tiny_config(total_steps=24, checkpoint_every=1000)
    straight = train(cfg, tmp_path / "straight")

    work = tmp_path / "interrupted"
    args = [sys.executable, "-m", "bertology.pretrain", f"--config={REPO}/configs/bert.py:tiny", f"--workdir={work}"]
    args += [f"--config.{k}={v}" for k, v in dict(
        batch_size=16, total_steps=24, log_every=1, eval_every=0, checkpoint_every=1000,
        **{"data.max_seq_length": 64, "data.max_predictions_per_seq": 10, "mesh.shape": "(1,1)"}).items()]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = work / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out  # distinct from a finished run's 0: a scheduler requeues it
    assert "SIGTERM: checkpoint written at step" in out and "stopped by SIGTERM" in out, out
    stopped = int(out.split("checkpoint written at step ")[1].split(";")[0])
    assert 5 <= stopped < 24

    resumed = train(cfg, work)  # same workdir: resumes from the SIGTERM checkpoint
    assert resumed["history"][0]["step"] == stopped + 1
    rows = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 25))  # each step once, whatever the stopped run logged
    first_part = [r["loss"] for r in rows][:stopped]
    np.testing.assert_array_equal(first_part, losses(straight)[:stopped])
    np.testing.assert_array_equal(losses(resumed), losses(straight)[stopped:])
    for a, b in zip(jax.tree.leaves(resumed["state"]["params"]), jax.tree.leaves(straight["state"]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_one_device_and_eight_devices_agree(tmp_path):
    assert jax.device_count() == 8
    runs = {}
    for shape in [(1, 1), (8, 1), (4, 2)]:
        runs[shape] = train(tiny_config(total_steps=6, **{"mesh.shape": shape}), tmp_path / str(shape))
    for shape in [(8, 1), (4, 2)]:
        np.testing.assert_allclose(losses(runs[shape]), losses(runs[(1, 1)]), atol=1e-5, rtol=0)
    # Parameters are placed as the rules say: heads and MLP units split over `model`, the rest replicated.
    params = runs[(4, 2)]["state"]["params"]
    query = params["encoder"]["attention_0"]["query"]["kernel"]  # (embed, heads, kv)
    assert query.sharding.spec == jax.sharding.PartitionSpec(None, "model", None)
    assert query.addressable_shards[0].data.shape == (128, 1, 64)
    wi = params["encoder"]["ffn_0"]["intermediate"]["kernel"]  # (embed, mlp)
    assert wi.addressable_shards[0].data.shape == (128, 256)
    token = params["encoder"]["embeddings"]["token"]["embedding"]
    assert token.addressable_shards[0].data.shape == token.shape
    mu = runs[(4, 2)]["state"]["opt_state"][1][0].mu["encoder"]["ffn_0"]["intermediate"]["kernel"]
    assert mu.sharding.spec == wi.sharding.spec


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    """k microbatches of B/k rows give the same update as one batch of B (dropout off): each
    microbatch's terms are divided by the whole batch's weight, so the masked tokens falling
    unevenly on the microbatches changes nothing (tests/test_accumulation.py: every objective)."""
    kw = {"model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0, "total_steps": 3}
    a = train(tiny_config(grad_accum_steps=1, **kw), tmp_path / "a")
    b = train(tiny_config(grad_accum_steps=4, **kw), tmp_path / "b")
    for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "grad_norm"):
        np.testing.assert_allclose(losses(b, key), losses(a, key), rtol=1e-6, atol=1e-7, err_msg=key)


def test_init_checkpoint_starts_from_another_runs_parameters(tmp_path):
    first = train(tiny_config(total_steps=3), tmp_path / "first")
    # The warmup's learning rate is 0 at step 0, so after one step the parameters are still the source's.
    second = train(tiny_config(total_steps=1, init_checkpoint=str(tmp_path / "first")), tmp_path / "second")
    for a, b in zip(jax.tree.leaves(first["state"]["params"]), jax.tree.leaves(second["state"]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert second["history"][0]["loss"] < first["history"][0]["loss"]  # it starts where the first run ended


def test_a_run_from_a_checkpoint_computes_as_its_own_config_says(tmp_path, capsys):
    """`init_checkpoint` gives what the network is, the run's own config how it computes and its
    dropout (`models.RUN_KEYS`): remat and the norm's backward are this run's and recorded in its
    config.json, and a backend this machine lacks stops the run in one line (before 7038a7b, the
    checkpoint's block stood whole and both were silently dropped). Fine-tuning's configs leave
    those keys unset (the checkpoint's values) and take them from the command line, whatever the
    checkpoint's family: cuDNN's fix (attention dropout 0) is one a fine-tuning run can apply."""
    from bertology import finetune as finetune_cli
    from bertology.train.finetune import finetune

    first, second = tmp_path / "first", tmp_path / "second"
    train(tiny_config(total_steps=1, **{"model.norm_backward": "written_out"}), first)
    train(tiny_config(total_steps=1, init_checkpoint=str(first), **{"model.remat": "full"}), second)
    recorded = json.loads((second / "config.json").read_text())["model"]
    assert (recorded["remat"], recorded["norm_backward"]) == ("full", "autodiff")
    with pytest.raises(UserError, match="attention_backend='cudnn'"):
        train(tiny_config(total_steps=1, init_checkpoint=str(first), **{"model.attention_backend": "cudnn"}),
              tmp_path / "third")

    def fine_tuned(name, **settings):
        unset = {f"model.{k}": None for k in models.RUN_KEYS}  # as fine-tuning's configs leave them
        finetune(helpers.tiny("embedded", init_checkpoint=str(second), total_steps=1, **{**unset, **settings}),
                 tmp_path / name)
        block = json.loads((tmp_path / name / "config.json").read_text())["model"]
        return {k: block[k] for k in models.RUN_KEYS}

    assert fine_tuned("unset") == {k: recorded[k] for k in models.RUN_KEYS}
    assert fine_tuned("set", **{"model.remat": "none", "model.attention_dropout_rate": 0.0}) == {
        **{k: recorded[k] for k in models.RUN_KEYS}, "remat": "none", "attention_dropout_rate": 0.0}

    def cli(*settings):
        status = finetune_cli.main(["bertology.finetune", "--config=configs/finetune/embedded.py",
                                    f"--workdir={tmp_path / 'cli'}", f"--config.init_checkpoint={second}",
                                    "--config.total_steps=1", *settings])
        return status, capsys.readouterr().err.strip().splitlines()

    capsys.readouterr()
    status, lines = cli("--config.model.attention_backend=cudnn")
    assert status != 0 and len(lines) == 1 and "set model.attention_dropout_rate=0" in lines[0], lines
    status, lines = cli("--config.model.attention_backend=cudnn", "--config.model.attention_dropout_rate=0")
    assert status != 0 and lines == ["bertology.finetune: error: model.attention_backend='cudnn' needs an NVIDIA GPU "
                                     "(this process runs on cpu); use model.attention_backend='auto' (falls back to "
                                     "'xla') or 'xla'"]
    assert not (tmp_path / "cli").exists()
