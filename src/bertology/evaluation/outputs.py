"""Files a fine-tuning run leaves behind: submission-format predictions, results, a summary table.

GLUE's server takes one TSV per task named as its leaderboard names it (`SST-2.tsv`,
`MNLI-m.tsv`, ...) with an `index<TAB>prediction` header; SQuAD's scripts take a JSON object
mapping question id to answer text ("" for no answer). `results.json` holds one run's scores;
`summary_table` gathers many runs' results into one Markdown table for the README.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

from bertology.files import atomic_write


def write_glue_tsv(path: str | pathlib.Path, indices: Sequence[int], predictions: Sequence[Any]) -> pathlib.Path:
    """`index<TAB>prediction` rows; floats (STS-B) with three decimals, labels as given."""
    rows = ["index\tprediction"]
    rows += [f"{i}\t{p:.3f}" if isinstance(p, float) else f"{i}\t{p}" for i, p in zip(indices, predictions)]
    return atomic_write(path, "\n".join(rows) + "\n")


def write_squad_json(path: str | pathlib.Path, predictions: dict[str, str]) -> pathlib.Path:
    return atomic_write(path, json.dumps(predictions, indent=2, ensure_ascii=False))


def write_results(workdir: str | pathlib.Path, results: dict[str, Any]) -> pathlib.Path:
    return atomic_write(pathlib.Path(workdir) / "results.json", json.dumps(results, indent=2, sort_keys=True))


def summary_table(results: Sequence[dict[str, Any]]) -> str:
    """A Markdown table: one row per run (task, checkpoint, mode), one column per metric seen."""
    metrics = sorted({m for r in results for m in r.get("scores", {})})
    head = ["task", "init", "mode", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        scores = r.get("scores", {})
        cells = [str(r.get("task", "?")), str(r.get("init_checkpoint") or "scratch"), str(r.get("mode", "full"))]
        cells += [f"{scores[m]:.2f}" if m in scores else "" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
