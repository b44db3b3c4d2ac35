"""Metrics a person can follow and tools can read: log lines, metrics.jsonl, TensorBoard.

TensorBoard event files are written with tensorboardX, which needs no TensorFlow. Only process 0
writes; other processes get a writer that does nothing.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Mapping

import jax


def log(message: str) -> None:
    if jax.process_index() == 0:
        print(message, file=sys.stdout, flush=True)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class MetricsWriter:
    """Appends `{"step": s, **metrics}` lines to workdir/metrics.jsonl and TensorBoard scalars."""

    def __init__(self, workdir: str | pathlib.Path):
        self.enabled = jax.process_index() == 0
        if not self.enabled:
            return
        from tensorboardX import SummaryWriter

        workdir = pathlib.Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)
        self._tb = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float], prefix: str = "") -> None:
        if not self.enabled:
            return
        row = {f"{prefix}{k}": float(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **row}) + "\n")
        for k, v in row.items():
            self._tb.add_scalar(k, v, int(step))

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()
