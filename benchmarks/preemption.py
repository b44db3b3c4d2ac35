"""From SIGTERM to a finished checkpoint: how long a preempted pretraining run needs, against
the grace period a scheduler gives (30 s on preemptible/spot VMs).

    python -m benchmarks.preemption [--configs configs/bert.py:tiny,configs/bert.py:base] \
        [--batch_size 8] [--max_seq_length 128] [--out benchmarks/out]

Each config pretrains on the embedded corpus in a fresh process; after its second logged step the
process gets SIGTERM, and the time until it exits (status 143, a checkpoint of the step it was on
written and verified) is the row, with the checkpoint's size on disk. The step in flight when the
signal lands is part of the time: the loop finishes it, then saves. Rows go to
out/preemption.{jsonl,md} (benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import report

REPO = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = ("config", "batch_size", "max_seq_length", "device", "step_s", "sigterm_to_exit_s", "exit_status",
           "checkpoint_mb")
FORMATS = {"step_s": "{:.2f}", "sigterm_to_exit_s": "{:.1f}", "checkpoint_mb": "{:.0f}"}


def measure(config: str, batch_size: int, max_seq_length: int, timeout: float = 1800) -> dict:
    """One row: SIGTERM after the second logged step, the seconds until the process exits."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp) / "run"
        overrides = dict(total_steps=1_000_000, log_every=1, eval_every=0, checkpoint_every=1_000_000,
                         batch_size=batch_size, **{"data.max_seq_length": max_seq_length,
                                                   "data.max_predictions_per_seq": max(1, round(0.15 * max_seq_length))})
        args = [sys.executable, "-m", "bertology.pretrain", f"--config={REPO / config}", f"--workdir={workdir}",
                *(f"--config.{k}={v}" for k, v in overrides.items())]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        steps, lines, start = [], [], time.monotonic()
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step "):
                steps.append(time.monotonic())
                if len(steps) == 2:
                    break
            if time.monotonic() - start > timeout:
                break
        if len(steps) < 2:
            proc.kill()
            raise RuntimeError(f"{config} logged no second step:\n{''.join(lines[-20:])}")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.stdout.read()
        status = proc.wait()
        elapsed = time.monotonic() - sent
        size = sum(f.stat().st_size for f in (workdir / "checkpoints").rglob("*") if f.is_file())
    import jax

    return {"config": config, "batch_size": batch_size, "max_seq_length": max_seq_length,
            "device": jax.devices()[0].device_kind, "step_s": steps[1] - steps[0], "sigterm_to_exit_s": elapsed,
            "exit_status": status, "checkpoint_mb": size / 2**20}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="configs/bert.py:tiny,configs/bert.py:base")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    args = p.parse_args(argv)
    rows = [measure(c, args.batch_size, args.max_seq_length) for c in args.configs.split(",")]
    report.append(rows, pathlib.Path(args.out), "preemption", COLUMNS, FORMATS)
    return rows


if __name__ == "__main__":
    main()
