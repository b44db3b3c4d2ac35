"""Metrics a person can follow and tools can read: log lines, metrics.jsonl, TensorBoard, and
the experiment trackers a config names (`bertology.train.trackers`).

TensorBoard event files are written with tensorboardX, which needs no TensorFlow. Only process 0
writes; other processes get a writer that does nothing.

A workdir on object storage (gs://, for TPU pods) cannot be appended to, so there metrics.jsonl
is appended locally and copied over the remote file at every `flush` (each log line) and at
`close`; tensorboardX writes gs:// itself (with google-cloud-storage installed).

A resumed run redoes the steps after its checkpoint, so the writer first drops the rows of
metrics.jsonl after the step it resumed from (`after_step`; rewritten atomically): every step
has one row. TensorBoard event files are append-only and keep the old rows; TensorBoard shows
the later values of a step written twice.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

import jax
from etils import epath

from bertology.files import is_remote
from bertology.train.trackers import Tracker


def log(message: str) -> None:
    if jax.process_index() == 0:
        print(message, file=sys.stdout, flush=True)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class MetricsWriter:
    """Appends `{"step": s, **metrics}` lines to workdir/metrics.jsonl, TensorBoard scalars and
    the `trackers`' rows, after dropping the file's rows with step > `after_step` (None: keep every
    row). Closes the trackers with itself."""

    def __init__(self, workdir: str | pathlib.Path, after_step: int | None = None,
                 trackers: Sequence[Tracker] = ()):
        self.enabled = jax.process_index() == 0
        self._trackers = trackers
        if not self.enabled:
            return
        workdir = epath.Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self._remote = workdir / "metrics.jsonl" if is_remote(workdir) else None
        local = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl" if self._remote else workdir / "metrics.jsonl"
        if self._remote and self._remote.exists():  # a resumed run continues the remote file
            local.write_text(self._remote.read_text())
        if after_step is not None and local.exists():
            keep = [line for line in local.read_text().splitlines(keepends=True)
                    if line.endswith("\n") and json.loads(line)["step"] <= after_step]  # a kill may cut the last line
            tmp = local.with_name(local.name + ".tmp")
            tmp.write_text("".join(keep))
            os.replace(tmp, local)
        self._jsonl = open(local, "a", buffering=1)
        self._tb = _summary_writer(str(workdir / "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float], prefix: str = "") -> None:
        if not self.enabled:
            return
        row = {f"{prefix}{k}": float(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **row}) + "\n")
        for k, v in row.items():
            self._tb.add_scalar(k, v, int(step))
        for tracker in self._trackers:
            tracker.log(int(step), row)

    def steps(self) -> dict[int, dict[str, float]]:
        """Every step in metrics.jsonl (this run's and those of the runs it resumed), in order,
        each step's rows merged. A step written twice (a run resumed from a checkpoint before
        it) keeps the later values: those of the run that went on. Empty on processes but 0."""
        if not self.enabled:
            return {}
        self._jsonl.flush()
        return read_steps(pathlib.Path(self._jsonl.name))

    def flush(self) -> None:
        """Make everything written so far visible in the workdir (a copy, for object storage)."""
        if self.enabled and self._remote:
            self._remote.write_text(pathlib.Path(self._jsonl.name).read_text())

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()
            self.flush()
            for tracker in self._trackers:
                tracker.close()


def _summary_writer(logdir: str) -> Any:
    """tensorboardX's SummaryWriter, imported without torch where torch is not loaded yet:
    tensorboardX imports an installed torch only to accept its tensors as values (2.8 s of each
    training process's start-up on the 2-core machine, with the test extra's torch), and we log
    floats. Nothing else first imported by tensorboardX asks for torch (measured: protobuf and
    multiprocessing modules only), so no other module caches its absence."""
    if "torch" not in sys.modules and "tensorboardX" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
        try:
            import tensorboardX  # noqa: F401
        finally:
            del sys.modules["torch"]
    from tensorboardX import SummaryWriter

    return SummaryWriter(logdir)


def read_steps(path: pathlib.Path) -> dict[int, dict[str, float]]:
    """The steps of a metrics.jsonl in order, each step's rows merged; a step written twice (a run
    resumed from a checkpoint before it) keeps the later values, those of the run that went on."""
    merged: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        merged.setdefault(row.pop("step"), {}).update(row)
    return dict(sorted(merged.items()))
