"""Training curves of several runs on one plot: the first of "why fine-tuning works" (Hao et al.
2019, "Visualizing and Understanding the Effectiveness of BERT"), fine-tuning from a pretrained
run against the same task from scratch, or any runs' logged metric side by side.

Each run's metrics.jsonl is read as the run left it (a resumed run's later rows win,
`train.metrics.read_steps`); the plot shows every logged value faintly and a moving average over
`smooth` logged steps on top, since per-batch losses of fine-tuning swing too much to compare.
"""

from __future__ import annotations

import pathlib

import numpy as np

from bertology.analysis.plots import pyplot, save
from bertology.errors import UserError


def read(runs: dict[str, pathlib.Path], metric: str) -> dict[str, dict[str, list[float]]]:
    """{label: {'steps', 'values'}}: `metric` at every step where each run logged it."""
    from bertology.train.metrics import read_steps

    out = {}
    for label, run in runs.items():
        path = pathlib.Path(run) / "metrics.jsonl"
        if not path.is_file():
            raise UserError(f"{path} not found; give the --workdir of a pretraining or fine-tuning run")
        steps = read_steps(path)
        logged = [(s, row[metric]) for s, row in steps.items() if metric in row]
        if not logged:
            names = sorted({k for row in steps.values() for k in row} - {"time"})
            raise UserError(f"run {label} ({run}) never logged {metric!r}; it logged {', '.join(names)}")
        out[label] = {"steps": [float(s) for s, _ in logged], "values": [float(v) for _, v in logged]}
    return out


def moving_average(values: list[float], window: int) -> np.ndarray:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    x = np.cumsum(np.concatenate([[0.0], values]))
    n = np.minimum(np.arange(1, len(values) + 1), window)
    return (x[1:] - x[np.arange(1, len(values) + 1) - n]) / n


def plot(curves: dict[str, dict[str, list[float]]], metric: str, smooth: int, path: pathlib.Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (label, curve) in enumerate(curves.items()):
        color = f"C{i}"
        ax.plot(curve["steps"], curve["values"], color=color, alpha=0.25, linewidth=0.8)
        ax.plot(curve["steps"], moving_average(curve["values"], smooth), color=color, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} (faint: as logged; solid: mean of {smooth} logged steps)", fontsize="medium")
    ax.legend(fontsize="small")
    save(fig, path)


def summary(curves: dict[str, dict[str, list[float]]], smooth: int) -> dict[str, dict[str, float]]:
    """Per run: its first and last smoothed values and the steps it logged."""
    out = {}
    for label, c in curves.items():
        smoothed = moving_average(c["values"], smooth)
        out[label] = {"first": float(smoothed[0]), "last": float(smoothed[-1]), "steps": c["steps"][-1]}
    return out
