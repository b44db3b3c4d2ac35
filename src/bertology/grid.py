"""Fine-tuning results as papers report them: a learning-rate grid, several seeds, the median.

    python -m bertology.grid --config configs/finetune/glue.py:rte --config.init_checkpoint=runs/base \\
        --learning_rates 2e-5,3e-5,5e-5 --seeds 5 --workdir runs/rte_grid
    python -m bertology.grid --score_card runs/cola_grid runs/sst2_grid runs/mnli ...

Fine-tuning a small task from one seed is a lottery: on RTE or MRPC the score moves by several
points between seeds. So the papers the lineage is compared by fine-tune every task several times
and report the median: BERT picks the learning rate on the dev set; RoBERTa and ELECTRA report
the median over five and ten restarts. Here each (learning rate, seed) is an ordinary fine-tuning
run in `WORKDIR/lr<rate>_seed<seed>` (a finished one is skipped, an interrupted one resumes), the
learning rate whose median primary score is best is chosen, and `grid.json` / `grid.md` give the
median of every score at each rate with its spread (lowest and highest seed) and the seeds' own
scores. `--score_card` reads grids or single runs of GLUE tasks and writes each task's official
metrics and the GLUE average as its leaderboard computes it (a task's metrics averaged first:
MRPC and QQP F1 and accuracy, STS-B Pearson and Spearman, MNLI matched and mismatched; then the
tasks, unweighted).
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
from typing import Any

from absl import flags

from bertology import cli
from bertology.errors import Preempted, UserError
from bertology.files import atomic_write
from bertology.finetune import help_config

# GLUE task -> its leaderboard metrics, in the order the leaderboard prints them (scores' keys).
GLUE_METRICS = {"cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"), "stsb": ("pearson", "spearman"),
                "qqp": ("f1", "accuracy"), "mnli": ("validation_matched_accuracy", "validation_mismatched_accuracy"),
                "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",)}


def run_name(learning_rate: float, seed: int) -> str:
    return f"lr{learning_rate:g}_seed{seed}"


def summarise(runs: list[dict[str, Any]], primary: str) -> dict[str, Any]:
    """From [{learning_rate, seed, scores}]: per rate every score's median, lowest, highest and
    the seeds', the best rate (highest median primary score; ties to the smaller rate) and its
    medians."""
    rates = sorted({r["learning_rate"] for r in runs})
    by_rate = {}
    for rate in rates:
        these = [r for r in runs if r["learning_rate"] == rate]
        metrics = sorted({m for r in these for m in r["scores"]})
        by_rate[f"{rate:g}"] = {m: {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
                                    "seeds": vals}
                                for m in metrics if (vals := [r["scores"][m] for r in these if m in r["scores"]])}
    if not rates or any(primary not in s for s in by_rate.values()):
        raise UserError(f"the runs have no {primary!r} score to choose a learning rate by; check the task's results.json")
    best = max(rates, key=lambda rate: (by_rate[f"{rate:g}"][primary]["median"], -rate))
    return {"primary": primary, "best_learning_rate": best, "by_learning_rate": by_rate,
            "median": {m: v["median"] for m, v in by_rate[f"{best:g}"].items()}}


def table(result: dict[str, Any]) -> str:
    """grid.md: a row per learning rate, each score as median [lowest–highest], the chosen rate marked."""
    rates = result["by_learning_rate"]
    metrics = sorted({m for v in rates.values() for m in v})
    lines = [f"{result['task']}: median of {result['seeds']} seeds per learning rate [lowest–highest]; "
             f"chosen by the median {result['primary']}", "",
             "| learning rate | " + " | ".join(metrics) + " |", "|---" * (1 + len(metrics)) + "|"]
    for rate, scores in rates.items():
        mark = " (chosen)" if float(rate) == result["best_learning_rate"] else ""
        cells = [f"{scores[m]['median']:.2f} [{scores[m]['min']:.2f}–{scores[m]['max']:.2f}]" if m in scores else ""
                 for m in metrics]
        lines.append(f"| {rate}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def grid(config: Any, learning_rates: list[float], seeds: list[int], workdir: str | pathlib.Path) -> dict[str, Any]:
    """Fine-tune `config` at every learning rate with every seed under `workdir` (finished runs are
    read, not rerun) and write grid.json and grid.md."""
    import ml_collections

    from bertology.train.finetune import finetune

    if not learning_rates or not seeds:
        raise UserError("give at least one learning rate (--learning_rates 2e-5,3e-5) and one seed (--seeds 5)")
    workdir = pathlib.Path(workdir)
    runs = []
    for rate in learning_rates:
        for seed in seeds:
            run = workdir / run_name(rate, seed)
            done = run / "results.json"
            result = json.loads(done.read_text()) if done.is_file() else {}
            if not result.get("scores") or result.get("preempted"):
                c = ml_collections.ConfigDict(config.to_dict())
                c.optimizer.learning_rate, c.seed = rate, seed
                result = finetune(c, run)
                if result.get("preempted"):  # its checkpoint is written; the rerun resumes it
                    raise Preempted("stopped by SIGTERM; rerun the same command to resume the grid")
            runs.append({"learning_rate": rate, "seed": seed, "scores": result["scores"]})
    out = {"task": result["task"], "seeds": len(seeds), **summarise(runs, result["primary"]), "runs": runs}
    atomic_write(workdir / "grid.json", json.dumps(out, indent=1))
    atomic_write(workdir / "grid.md", table(out))
    return out


def task_scores(workdir: pathlib.Path) -> tuple[str, dict[str, float]]:
    """(task, scores) of a grid (its medians at the chosen rate) or of one fine-tuning run."""
    for name, read in (("grid.json", lambda r: r["median"]), ("results.json", lambda r: r["scores"])):
        if (workdir / name).is_file():
            record = json.loads((workdir / name).read_text())
            return record["task"], read(record)
    raise UserError(f"{workdir} has neither grid.json nor results.json; pass finished grids or fine-tuning runs")


def score_card(workdirs: list[str]) -> str:
    """The GLUE score card (Markdown) of runs or grids, one per task: each task's official metrics
    and its score (their mean), then the average over the tasks given."""
    rows, seen = [], set()
    for d in workdirs:
        task, scores = task_scores(pathlib.Path(d))
        if task not in GLUE_METRICS:
            raise UserError(f"{d} is a {task} run; the GLUE score card takes {', '.join(GLUE_METRICS)}")
        if task in seen:
            raise UserError(f"{task} is given twice; pass one run or grid per task")
        seen.add(task)
        if missing := [m for m in GLUE_METRICS[task] if m not in scores]:
            raise UserError(f"{d}: the {task} scores lack {missing}; rerun it with the current bertology")
        values = [scores[m] for m in GLUE_METRICS[task]]
        rows.append((task, values, sum(values) / len(values)))
    rows.sort(key=lambda r: list(GLUE_METRICS).index(r[0]))
    lines = ["| task | metrics | score |", "|---|---|---|"]
    for task, values, score in rows:
        metrics = " / ".join(f"{m.removeprefix('validation_')} {v:.1f}" for m, v in zip(GLUE_METRICS[task], values))
        lines.append(f"| {task} | {metrics} | {score:.1f} |")
    average = sum(score for *_, score in rows) / len(rows)
    complete = "all nine tasks" if len(rows) == len(GLUE_METRICS) else f"{len(rows)} of 9 tasks: not the GLUE score"
    lines.append(f"| **average** | {complete} | **{average:.1f}** |")
    return "\n".join(lines) + "\n"


def _define(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", "runs/grid", "One fine-tuning run per (rate, seed), grid.json and grid.md.",
                        flag_values=fv)
    flags.DEFINE_list("learning_rates", ["2e-5", "3e-5", "5e-5"], "The learning rates to try (BERT's GLUE grid).",
                      flag_values=fv)
    flags.DEFINE_integer("seeds", 5, "Seeds per learning rate (0, 1, ...).", flag_values=fv)


def _main(fv: flags.FlagValues) -> None:
    try:
        rates = [float(r) for r in fv.learning_rates]
    except ValueError:
        raise UserError(f"--learning_rates {','.join(fv.learning_rates)}: give numbers, e.g. 2e-5,3e-5") from None
    grid(fv.config, rates, list(range(fv.seeds)), fv.workdir)
    print((pathlib.Path(fv.workdir) / "grid.md").read_text())


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status."""
    argv = sys.argv if argv is None else argv
    if argv[1:2] == ["--score_card"]:
        return cli.guarded("bertology.grid", lambda: print(score_card(argv[2:])))
    return cli.run("bertology.grid", _main, _define, argv, help_config)


if __name__ == "__main__":
    cli.end_process(main())
