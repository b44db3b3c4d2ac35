"""A long pretraining run of the tiny preset, watched from outside: host memory (RSS) across
checkpoints and evaluations, one metrics row per step, the configured number of checkpoints kept.

    python -m benchmarks.soak [--steps 20000] [--every 200] [--keep 3] [--out benchmarks/out]

The run is `bertology.pretrain --config configs/bert.py:tiny` on the embedded corpus (batch 8 of 64
tokens by default, so tens of thousands of steps fit in minutes on a CPU), with a checkpoint and
an evaluation every `--every` steps. Its RSS is sampled every second with the step it was on.
At the end the run is checked: every step 1..N has exactly one training row in metrics.jsonl,
every `--every`-th step one evaluation row, and `--keep` checkpoints remain. Writes
out/soak_rss.jsonl (the curve), out/soak_rss.png, and a summary row to out/soak.{jsonl,md}: RSS
after the first checkpoint, at the end, and the growth per 1,000 steps fitted over the second
half of the run. Exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks import report

REPO = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = ("steps", "every", "keep", "wall_s", "rss_first_checkpoint_mb", "rss_end_mb", "growth_mb_per_1k_steps",
           "train_rows_ok", "eval_rows_ok", "checkpoints_kept")
FORMATS = {"wall_s": "{:.0f}", "rss_first_checkpoint_mb": "{:.0f}", "rss_end_mb": "{:.0f}",
           "growth_mb_per_1k_steps": "{:.2f}"}


def rss_mb(pid: int) -> float | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def soak(steps: int, every: int, keep: int, batch_size: int, max_seq_length: int, workdir: pathlib.Path) -> tuple[dict, list]:
    overrides = dict(total_steps=steps, log_every=every // 4 or 1, eval_every=every, checkpoint_every=every,
                     keep_checkpoints=keep, batch_size=batch_size, eval_batches=2,
                     **{"data.max_seq_length": max_seq_length,
                        "data.max_predictions_per_seq": max(1, round(0.15 * max_seq_length))})
    args = [sys.executable, "-m", "bertology.pretrain", f"--config={REPO}/configs/bert.py:tiny", f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in overrides.items())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    start = time.monotonic()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    step, tail = [0], []

    def read() -> None:
        for line in proc.stdout:
            tail[:] = [*tail[-30:], line]
            if line.startswith("step "):
                step[0] = int(line.split()[1].split("/")[0])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    curve = []
    while proc.poll() is None:
        rss = rss_mb(proc.pid)
        if rss is not None:
            curve.append({"t": time.monotonic() - start, "step": step[0], "rss_mb": rss})
        time.sleep(1.0)
    reader.join()
    if proc.returncode:
        raise RuntimeError(f"the soak run exited with {proc.returncode}:\n{''.join(tail)}")
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = sorted(r["step"] for r in rows if "loss" in r)
    evals = sorted(r["step"] for r in rows if any(k.startswith("eval_") for k in r))
    kept = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    after = [c for c in curve if c["step"] >= every]
    late = [c for c in curve if c["step"] >= steps // 2]
    growth = float(np.polyfit([c["step"] for c in late], [c["rss_mb"] for c in late], 1)[0] * 1000) if len(late) > 2 else None
    summary = {"steps": steps, "every": every, "keep": keep, "wall_s": time.monotonic() - start,
               "rss_first_checkpoint_mb": after[0]["rss_mb"] if after else None,
               "rss_end_mb": curve[-1]["rss_mb"] if curve else None, "growth_mb_per_1k_steps": growth,
               "train_rows_ok": train == list(range(1, steps + 1)),
               "eval_rows_ok": evals == list(range(every, steps + 1, every)) + ([steps] if steps % every else []),
               "checkpoints_kept": kept}
    return summary, curve


def plot(curve: list[dict], every: int, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = [c for c in curve if c["step"] > 0]  # from the first logged step on (start-up is not the question)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([c["step"] for c in curve], [c["rss_mb"] for c in curve])
    ax.set_xlabel(f"step (a checkpoint and an evaluation every {every})")
    ax.set_ylabel("RSS (MiB)")
    ax.set_ylim(0, 1.1 * max(c["rss_mb"] for c in curve))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--every", type=int, default=200)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_seq_length", type=int, default=64)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        summary, curve = soak(args.steps, args.every, args.keep, args.batch_size, args.max_seq_length,
                              pathlib.Path(tmp) / "run")
    (out / "soak_rss.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curve))
    if any(c["step"] > 0 for c in curve):
        plot(curve, args.every, out / "soak_rss.png")
    report.append([summary], out, "soak", COLUMNS, FORMATS)
    expected = list(range(args.every, args.steps + 1, args.every))[-args.keep:]
    if args.steps % args.every:
        expected = [*expected, args.steps][-args.keep:]
    if not (summary["train_rows_ok"] and summary["eval_rows_ok"] and summary["checkpoints_kept"] == expected):
        sys.exit(f"soak: a check failed: {summary}")
    return summary


if __name__ == "__main__":
    main()
