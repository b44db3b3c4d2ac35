"""The streaming input end to end: exact resume after kill -9 between checkpoints, and 1 vs 8
devices, with windows small enough that the runs cross several of them."""

import json
import os
import signal
import subprocess
import sys
import time

import helpers
import jax
import numpy as np
import pytest

from bertology.train.loop import train

STEPS, CHECKPOINT = 16, 5


def config(**overrides):
    c = helpers.config("bert", "tiny")
    c.batch_size = 16
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.data.window_documents = 8  # ~60 rows a window: 16 steps cross several
    c.total_steps = STEPS
    c.log_every = 1
    c.eval_every = 0
    c.checkpoint_every = CHECKPOINT
    c.keep_checkpoints = 5
    c.mesh.shape = (1, 1)
    c.update(overrides)
    return c


@pytest.mark.slow
def test_kill_9_between_checkpoints_resumes_exactly(tmp_path):
    straight = train(config(), tmp_path / "straight")
    work = tmp_path / "killed"
    script = (f"import json, ml_collections; from bertology.train.loop import train; "
              f"train(ml_collections.ConfigDict(json.loads({config().to_json()!r})), {str(work)!r})")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ))  # the same 8 simulated devices as this process
    metrics = work / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        written = (work / "checkpoints" / str(CHECKPOINT)).is_dir()  # orbax renames a finished save into place
        if written and len(metrics.read_text().splitlines()) >= CHECKPOINT + 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = sorted(int(d.name) for d in (work / "checkpoints").iterdir() if d.name.isdigit())
    logged = len(metrics.read_text().splitlines())
    assert saved and saved[-1] < logged < STEPS  # killed after steps the last checkpoint does not hold
    resumed = train(config(), work)
    assert resumed["history"][0]["step"] == saved[-1] + 1
    np.testing.assert_array_equal([h["loss"] for h in resumed["history"]],
                                  [h["loss"] for h in straight["history"]][saved[-1]:])
    for a, b in zip(jax.tree.leaves(resumed["state"]["params"]), jax.tree.leaves(straight["state"]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_one_device_and_eight_devices_agree_across_windows(tmp_path):
    assert jax.device_count() == 8
    one = train(config(total_steps=8, checkpoint_every=1000, data=dict(masking="dynamic")), tmp_path / "one")
    eight = train(config(total_steps=8, checkpoint_every=1000, data=dict(masking="dynamic"), mesh=dict(shape=(8, 1))),
                  tmp_path / "eight")
    np.testing.assert_allclose([h["loss"] for h in eight["history"]], [h["loss"] for h in one["history"]],
                               atol=1e-5, rtol=0)
