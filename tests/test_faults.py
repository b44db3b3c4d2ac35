"""Faults a long run must survive (issue 18), each injected: divergence, damaged checkpoints,
a full disk, two runs on one workdir, a config changed on resume, SIGTERM, kill -9 mid-save.

Most use the run setup with the bigram LM of tests/helpers.py (a second a run); divergence uses
the tiny BERT. "Exact" means bit-identical losses and parameters to an uninterrupted run.
"""

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from helpers import LM, REPO, Bigram, Cycle, bigram_config, lm_batch, tiny_config

from bertology import cli
from bertology.errors import Diverged, Preempted, UserError
from bertology.train import run as run_lib
from bertology.train.checkpoint import Checkpointer, load_params

STEPS, EVERY = 6, 2


def data():
    rng = np.random.default_rng(3)
    return [lm_batch(rng, False, weighted_rows=8) for _ in range(3)]


def fit(workdir, total=STEPS, batches=None, **overrides):
    """Train the bigram LM with Adam to `total` steps in `workdir`, checkpointing every EVERY."""
    batches = batches or Cycle(data())
    c = bigram_config(**{"eval_every": 0, "checkpoint_every": EVERY, "keep_checkpoints": 10, **overrides})
    with run_lib.setup(ml_collections.FrozenConfigDict(c), workdir, model=Bigram(), objective=LM, example={k: v[:1] for k, v in data()[0].items()},
                       optimizer=lambda _: (optax.adam(0.05), optax.constant_schedule(0.05))) as run:
        return run.fit(batches, total)


def losses(workdir):
    return {r["step"]: r["loss"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())}


def assert_same_run(out, straight, from_step):
    """`out` went on from `from_step` exactly as `straight` did."""
    assert [h["step"] for h in out["history"]] == list(range(from_step + 1, STEPS + 1))
    assert [h["loss"] for h in out["history"]] == [h["loss"] for h in straight["history"]][from_step:]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(out["state"]), jax.device_get(straight["state"]))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run, with checkpoints at 2, 4 and 6."""
    work = tmp_path_factory.mktemp("straight")
    return work, fit(work)


def files(directory):
    return sorted(p for p in directory.rglob("*") if p.is_file())


def largest_array_file(step_dir):
    return max(files(step_dir / "state"), key=lambda p: p.stat().st_size)


def flip_bytes(path):
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 8] = bytes(b ^ 0x5A for b in raw[mid:mid + 8])
    path.write_bytes(bytes(raw))


CORRUPTIONS = {
    "truncated data file": lambda d: (p := largest_array_file(d)).write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "deleted data file": lambda d: largest_array_file(d).unlink(),
    "overwritten data file": lambda d: largest_array_file(d).write_bytes(b"overwritten by something else"),
    "garbage metadata": lambda d: (d / "state" / "_METADATA").write_text("{not json at all"),
    "truncated iterator file": lambda d: [p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]) for p in files(d / "data")],
    "all files zero-length": lambda d: [p.write_bytes(b"") for p in files(d)],
    "emptied step dir": lambda d: [shutil.rmtree(p) if p.is_dir() else p.unlink() for p in list(d.iterdir())],
    "random bytes inside a data file, size unchanged": lambda d: flip_bytes(largest_array_file(d)),
}


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_damaged_newest_checkpoint_is_skipped_and_the_previous_one_resumed_exactly(straight, tmp_path, capsys, kind):
    base, ref = straight
    work = tmp_path / "work"
    shutil.copytree(base, work)
    CORRUPTIONS[kind](work / "checkpoints" / str(STEPS))
    capsys.readouterr()
    out = fit(work)
    log = capsys.readouterr().out
    assert f"checkpoint step {STEPS} skipped: " in log and f"at step {STEPS - EVERY}" in log, log
    assert_same_run(out, ref, STEPS - EVERY)
    assert [p.name.split("-")[0] for p in (work / "corrupt_checkpoints").iterdir()] == [str(STEPS)]
    lines = (work / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["step"] for l in lines] == list(range(1, STEPS + 1))  # no step twice
    assert losses(work) == losses(base)


def test_no_intact_checkpoint_refuses_instead_of_starting_over(straight, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(straight[0], work)
    for step in (2, 4, 6):
        flip_bytes(largest_array_file(work / "checkpoints" / str(step)))
    with pytest.raises(UserError, match=r"no intact checkpoint in .*steps \[6, 4, 2\] all failed verification"):
        fit(work)
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["2", "4", "6"]  # nothing moved or written


def test_a_nonfinite_step_leaves_the_state_unchanged_and_is_counted():
    model, batch = Bigram(), data()[0]
    params = {"Embed_0": {"embedding": np.random.default_rng(0).normal(size=(12, 12)).astype(np.float32)}}
    tx = optax.adam(0.05)
    step = jax.jit(run_lib.skip_nonfinite(run_lib.make_train_step(model, LM, tx, optax.constant_schedule(0.05), 1)))
    state = run_lib.initial_state(params, tx)
    good, m = step(state, batch, jax.random.key(0))
    assert int(good["skipped_steps"]) == 0 and int(m["skipped_steps"]) == 0
    assert not np.array_equal(good["params"]["Embed_0"]["embedding"], params["Embed_0"]["embedding"])
    poisoned = {**batch, "target_weights": np.where(np.arange(6) == 2, np.nan, batch["target_weights"]).astype(np.float32)}
    bad, m = step(good, poisoned, jax.random.key(0))
    assert not np.isfinite(float(m["loss"])) and int(m["skipped_steps"]) == 1
    assert int(bad["step"]) == 2 and int(bad["skipped_steps"]) == 1
    jax.tree.map(np.testing.assert_array_equal, bad["params"], good["params"])
    jax.tree.map(np.testing.assert_array_equal, bad["opt_state"], good["opt_state"])


def test_a_nonfinite_state_is_never_checkpointed(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2)
    with pytest.raises(UserError, match=r"step 3: the train state holds NaN or inf, so no checkpoint was written"):
        ckpt.save(3, {"step": np.int32(3), "params": {"w": np.array([1.0, np.inf], np.float32)}}, {})
    ckpt.wait()
    ckpt.close()
    assert not (tmp_path / "checkpoints" / "3").exists()


@pytest.mark.slow
def test_a_diverging_bert_stops_with_one_line_and_keeps_its_last_good_checkpoint(tmp_path):
    from bertology.train.loop import train

    cfg = tiny_config(total_steps=12, checkpoint_every=1, keep_checkpoints=20,
                      **{"optimizer.learning_rate": 1e6, "optimizer.warmup_steps": 1})
    with pytest.raises(Diverged, match=r"training diverged: .* 5 steps in a row .*try a lower optimizer.learning_rate") as e:
        train(cfg, tmp_path)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first_bad = next(r["step"] for r in rows if not np.isfinite(r["loss"]))
    assert [r["skipped_steps"] for r in rows] == [max(0, r["step"] - first_bad + 1) for r in rows]
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir())
    assert steps == list(range(1, first_bad))  # none written once steps were being skipped
    for step in steps:
        params, _ = load_params(tmp_path, step)
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    assert f"(steps {first_bad}-{first_bad + 4}, none applied" in str(e.value)
    assert f"the last checkpoint is step {first_bad - 1};" in str(e.value)


def test_a_full_disk_during_a_save_is_one_line_and_a_roomier_rerun_resumes_exactly(straight, tmp_path, monkeypatch):
    work = tmp_path / "work"
    original, calls = ocp.StandardCheckpointHandler.async_save, []

    async def full_disk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the step-4 save
            raise OSError(errno.ENOSPC, "No space left on device")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", full_disk)
    with pytest.raises(UserError, match=r"could not write checkpoint step 4 .*\(disk full\); the checkpoints before it are intact"):
        fit(work)
    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", original)
    assert sorted(p.name for p in (work / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    assert_same_run(fit(work), straight[1], 2)


def test_sigterm_checkpoints_and_the_cli_exits_143(tmp_path, capsys):
    class Terminated(Cycle):
        def __next__(self):
            if self.i == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().__next__()

    status = cli.run("prog", lambda fv: fit(tmp_path, batches=Terminated(data())),
                     argv=["prog", f"--config={REPO}/configs/bert.py:tiny"])
    out = capsys.readouterr()
    assert status == cli.EXIT_PREEMPTED == 143
    assert "SIGTERM: checkpoint written at step 4" in out.out and "prog: stopped by SIGTERM" in out.err
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "4"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # everything restored


def test_a_sigterm_swallowed_before_the_loop_still_stops_the_run(tmp_path, capsys, monkeypatch):
    """The CLI's SIGTERM handler raises `Preempted`; where that exception is raised inside a
    finalizer (in the wild: jax's garbage-collection callback during start-up), Python prints
    "Exception ignored" and carries on, and the run used to train to its end and exit 0. The loop
    now sees the request when it starts: a checkpoint after the first step, then exit 143."""

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)

    def main(fv):
        Finalized()  # dropped at once: its finalizer sends SIGTERM, and the handler's exception is ignored
        return fit(tmp_path)

    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    status = cli.run("prog", main, argv=["prog", f"--config={REPO}/configs/bert.py:tiny"])
    out = capsys.readouterr()
    assert swallowed == [Preempted]  # the handler's raise went nowhere
    assert status == cli.EXIT_PREEMPTED
    assert "SIGTERM: checkpoint written at step 1" in out.out
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_resume_drops_the_metrics_rows_after_the_checkpoint(straight, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(straight[0], work)
    shutil.rmtree(work / "checkpoints" / "6")  # as if killed after logging step 6, before its checkpoint
    with open(work / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "loss": 1.0')  # and cut mid-line
    fit(work)
    assert [json.loads(l)["step"] for l in (work / "metrics.jsonl").read_text().splitlines()] == list(range(1, STEPS + 1))
    assert losses(work) == losses(straight[0])


def test_config_drift_on_resume_is_refused_unless_allowed(straight, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(straight[0], work)
    saved = (work / "config.json").read_text()
    with pytest.raises(UserError, match=r"different config \(batch_size 8 -> 4, seed 0 -> 1\).*"
                                        r"--config.allow_config_change=batch_size,seed if the change is intended"):
        fit(work, batch_size=4, seed=1)
    assert (work / "config.json").read_text() == saved  # still describes the checkpoints
    fit(work, log_every=3, keep_checkpoints=4)  # logging and keeping are safe to change
    out = fit(work, 8, seed=1, allow_config_change="seed")
    assert [h["step"] for h in out["history"]] == [7, 8]
    assert json.loads((work / "config.json").read_text())["seed"] == 1


def test_a_key_added_since_the_run_started_is_not_drift(straight, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(straight[0], work)
    saved = json.loads((work / "config.json").read_text())
    del saved["grad_accum_steps"]  # as written by a version that had no such key
    (work / "config.json").write_text(json.dumps(saved))
    out = fit(work, 8)  # resumed from step 6, not refused
    assert [h["step"] for h in out["history"]] == [7, 8]


def live_lock(path, pid, host, heartbeat):
    path.write_text(json.dumps({"pid": pid, "host": host, "started": heartbeat, "heartbeat": heartbeat}))


def test_a_second_run_on_a_workdir_refuses_and_stale_locks_are_taken_over(tmp_path, capsys):
    lock = tmp_path / "run.lock"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        live_lock(lock, holder.pid, socket.gethostname(), time.time())
        with pytest.raises(UserError, match=rf"is in use by another run \(pid {holder.pid} on {socket.gethostname()}, started"):
            fit(tmp_path, 2)
        assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "config.json").exists()
        live_lock(lock, 1, "another-host", time.time() - 10)  # another host's run, heartbeat fresh
        with pytest.raises(UserError, match=r"pid 1 on another-host"):
            fit(tmp_path, 2)
    finally:
        holder.kill()
        holder.wait()
    live_lock(lock, holder.pid, socket.gethostname(), time.time())  # its process is gone now
    capsys.readouterr()
    fit(tmp_path, 2)
    assert "(that process is gone)" in capsys.readouterr().out and not lock.exists()
    live_lock(lock, 1, "another-host", time.time() - run_lib.RunLock.STALE_S - 1)
    fit(tmp_path, 4)
    assert "(no heartbeat for 5m" in capsys.readouterr().out and not lock.exists()


def test_the_lock_heartbeat_is_refreshed(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lib.RunLock, "HEARTBEAT_S", 0.05)
    lock = run_lib.RunLock(tmp_path)
    lock.acquire()
    first = lock.holder()["heartbeat"]
    time.sleep(0.5)
    assert lock.holder()["heartbeat"] > first and lock.holder()["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "run.lock").exists()


KILLED_DURING_SAVE = """
import pathlib, sys, time
import orbax.checkpoint as ocp
sys.path.insert(0, {tests!r})
original, calls = ocp.StandardCheckpointHandler.async_save, []
class Stalled:  # a write that does not finish: the step is never committed
    def __init__(self, writes):
        self.writes = writes
    def result(self, timeout=None):
        for write in self.writes:  # the arrays land in the temporary directory (created
            write.result()         # asynchronously, which the writes wait for) ...
        print("WRITING", flush=True)
        time.sleep(120)            # ... and the step is never finalised
async def stalled(self, *args, **kwargs):
    calls.append(1)
    futures = list(await original(self, *args, **kwargs) or [])
    return [*futures, Stalled(futures)] if len(calls) == 2 else futures  # the step-4 save
ocp.StandardCheckpointHandler.async_save = stalled
from test_faults import fit
fit(pathlib.Path({work!r}))
"""


def test_kill_9_during_a_checkpoint_write_resumes_exactly(straight, tmp_path):
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DURING_SAVE.format(tests=str(REPO / "tests"), work=str(work))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output = []
    for line in proc.stdout:  # training goes on meanwhile: its log lines share the pipe
        output.append(line)
        if "WRITING" in line:
            break
    assert [p for p in (work / "checkpoints").iterdir() if "tmp" in p.name], (
        [p.name for p in (work / "checkpoints").iterdir()], "".join(output[-30:]))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert_same_run(fit(work), straight[1], 2)
    assert losses(work) == losses(straight[0])



def test_a_checkpoint_from_before_checksums_resumes_exactly(tmp_path, straight):
    """A step written before manifests and the skipped-step count existed (no `checksums` item, no
    `skipped_steps` in the state) is resumed unverified, with the count starting at 0."""
    _, straight_out = straight
    fit(tmp_path, total=4)
    directory = tmp_path / "checkpoints"
    handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(directory, item_handlers=handlers) as manager:
        saved = manager.restore(4, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                            data=ocp.args.JsonRestore()))
    shutil.rmtree(directory / "4")
    saved["state"].pop(run_lib.SKIPPED)
    with ocp.CheckpointManager(directory, item_handlers=handlers) as manager:  # as the code before checksums
        manager.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(saved["state"]),
                                                data=ocp.args.JsonSave(saved["data"])))
    assert not (directory / "4" / "checksums").exists()
    assert_same_run(fit(tmp_path), straight_out, 4)


def test_a_reader_of_a_run_checks_its_params_and_leaves_the_run_as_it_was(straight, tmp_path, capsys, caplog):
    """load_params (fine-tuning, export, features, analysis) checks the params against the saved
    manifest as resume checks the state: a damaged newest step gives way to the newest intact one
    with a log line, a damaged step asked for by number is refused, and nothing is moved."""
    work = tmp_path / "work"
    shutil.copytree(straight[0], work)
    intact = {step: load_params(work, step)[0] for step in (2, 4)}
    handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                "checksums": ocp.JsonCheckpointHandler()}
    directory = work / "checkpoints"
    with ocp.CheckpointManager(directory, item_handlers=handlers) as manager:
        saved = manager.restore(STEPS, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore(), checksums=ocp.args.JsonRestore()))
    shutil.rmtree(directory / str(STEPS))
    embedding = np.array(saved["state"]["params"]["Embed_0"]["embedding"])
    embedding[3, 5] = np.nextafter(embedding[3, 5], np.inf)  # one bit of one float, after its manifest was written
    saved["state"]["params"]["Embed_0"]["embedding"] = embedding
    with ocp.CheckpointManager(directory, item_handlers=handlers) as manager:
        manager.save(STEPS, args=ocp.args.Composite(state=ocp.args.StandardSave(saved["state"]),
                                                    data=ocp.args.JsonSave(saved["data"]),
                                                    checksums=ocp.args.JsonSave(saved["checksums"])))
    capsys.readouterr()
    jax.tree.map(np.testing.assert_array_equal, load_params(work)[0], intact[4])
    assert (f"checkpoint step {STEPS} of {work} skipped: checksum mismatch in 1 array(s), "
            "e.g. ['params']['Embed_0']['embedding']") in capsys.readouterr().out
    with pytest.raises(UserError, match=rf"checkpoint step {STEPS} in .* is damaged: checksum mismatch .* read another "
                                        r"step \(its steps are 2, 4, 6\) or restore it from a backup"):
        load_params(work, STEPS)

    CORRUPTIONS["all files zero-length"](directory / "4")
    jax.tree.map(np.testing.assert_array_equal, load_params(work)[0], intact[2])
    assert "checkpoint step 4 of " in capsys.readouterr().out
    flip_bytes(largest_array_file(directory / "2"))
    with pytest.raises(UserError, match=r"no intact checkpoint in .*: steps \[6, 4, 2\] all failed verification"):
        load_params(work)
    assert sorted(p.name for p in work.iterdir()) == sorted(p.name for p in straight[0].iterdir())  # nothing set aside
    assert sorted(p.name for p in directory.iterdir()) == ["2", "4", "6"]
    assert "could not be restored" not in caplog.text  # orbax's warning about the manifest item is gone


def test_a_moved_vocabulary_is_not_config_drift(tmp_path):
    """The same vocabulary file at another path (another clone of the repo) is not a change; a
    different file is."""
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    a.write_text("[PAD]\nhello\n")
    b.write_text("[PAD]\nhello\n")
    c.write_text("[PAD]\nworld\n")
    assert run_lib.same_value(str(a), str(b))
    assert not run_lib.same_value(str(a), str(c))
    assert not run_lib.same_value(1, "1")
