"""Two processes on localhost, 4 CPU devices each, act as one 8-device run (gloo collectives).

Process 0 writes metrics.jsonl; the losses must match a single-process 8-device run, and a run
resumed by both processes from a shared checkpoint must continue exactly as it went on before.
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import helpers
import numpy as np
import pytest
from helpers import REPO

from bertology.train.loop import train

STEPS, CHECKPOINT = 6, 3
OVERRIDES = dict(batch_size=16, total_steps=STEPS, log_every=1, eval_every=0, checkpoint_every=CHECKPOINT,
                 keep_checkpoints=5, **{"data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
                                        "mesh.shape": "(8,1)", "mesh.strategy": "fsdp"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def two_processes(workdir: pathlib.Path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4",
           "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    port = free_port()
    args = [sys.executable, "-m", "bertology.pretrain", f"--config={REPO}/configs/bert.py:tiny",
            f"--workdir={workdir}", f"--coordinator=localhost:{port}", "--num_processes=2"]
    args += [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
    procs = [subprocess.Popen(args + [f"--process_id={i}"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # gloo's C++ notes ("[Gloo] Rank 0 is connected to 7 peer ranks ...") come from several threads at
    # once and may split one another's lines, so any line with a piece of one is theirs, not ours
    ours = [[line for line in out.splitlines() if "[Gloo]" not in line and "peer ranks" not in line] for out in outs]
    assert any("on 8 device(s)" in line for line in ours[0]) and ours[1] == [], outs  # only process 0 logs


def losses(workdir: pathlib.Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one_process_and_resume_exactly(tmp_path):
    one = helpers.config("bert", "tiny")
    for k, v in OVERRIDES.items():
        node, *path = [one, *k.split(".")]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = eval(v) if isinstance(v, str) and v.startswith("(") else v
    single = [h["loss"] for h in train(one, tmp_path / "single")["history"]]

    work = tmp_path / "two"
    two_processes(work)
    straight = losses(work)
    assert len(straight) == STEPS
    np.testing.assert_allclose(straight, single, atol=1e-5, rtol=0)

    # Keep only the step-3 checkpoint, as if both hosts had been stopped there; both resume from it.
    for d in (work / "checkpoints").iterdir():
        if d.name.isdigit() and int(d.name) > CHECKPOINT:
            shutil.rmtree(d)
    two_processes(work)
    resumed = losses(work)  # the resumed run replaced the rows after its checkpoint
    assert len(resumed) == STEPS and resumed == straight


@pytest.mark.slow
def test_a_lost_process_stops_the_other_with_one_line_and_status_75(tmp_path):
    """kill -9 of process 1 mid-run: process 0, blocked in its next collective, stops within the
    heartbeat timeout (1.5x for process 0, which lets the others go first) with one line naming
    process 1 and EXIT_LOST_PEER. Before, it hung until the runtime aborted it (signal 6, 90 s)."""
    import signal
    import time

    from bertology.train.distributed import EXIT_LOST_PEER

    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4",
           "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    args = [sys.executable, "-m", "bertology.pretrain", f"--config={REPO}/configs/bert.py:tiny",
            f"--workdir={tmp_path / 'run'}", f"--coordinator=localhost:{free_port()}", "--num_processes=2",
            "--heartbeat_timeout=8", *(f"--config.{k}={v}" for k, v in {**OVERRIDES, "total_steps": 100_000}.items())]
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    procs = [subprocess.Popen(args + [f"--process_id={i}"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
             for i, log in enumerate(logs)]
    try:
        deadline = time.monotonic() + 300
        while "step 2/" not in logs[0].read_text():
            assert time.monotonic() < deadline and procs[0].poll() is None, logs[0].read_text()[-2000:]
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert procs[0].wait(timeout=120) == EXIT_LOST_PEER, logs[0].read_text()[-2000:]
        assert time.monotonic() - killed < 8 * 1.5 + 30
    finally:
        for p in procs:
            p.kill()
    last = [line for line in logs[0].read_text().splitlines() if "Gloo" not in line][-1]
    assert last == ("bertology.pretrain: error: lost process 1, silent for 12 s (--heartbeat_timeout); rerun the whole "
                    "job to resume from the last complete checkpoint")
