"""The miniature replications: pretrain variants at equal FLOPs, fine-tune each, compare.

    python -m bertology.sweep --config configs/sweep/equal_flops.py --workdir runs/sweep
    python -m bertology.sweep --config configs/sweep/t5_objectives.py --workdir runs/t5_objectives
    python -m bertology.sweep --config configs/sweep/seq2seq_finetune.py --workdir runs/s2s_finetune

A sweep config names what to pretrain and what to fine-tune it on:
- `families`: family names, each the variant `<family>.py:tiny` of `configs_dir` unchanged;
- `variants`: further variants, each a dict `name`, `config` (`file.py[:arg]` in `configs_dir`),
  optional `overrides` (a nested dict over that config, applied after the sweep's shapes, e.g.
  `{"data": {"noise": {"kind": "iid"}}}`; one that sets `batch_size` gets the steps its budget buys
  at that batch, to rounding, and where the variants' batches differ the table shows steps ×
  batch) and optional `init_from` (a config spec pretrained first on `init_share`, default 0.5, of
  the budget, whose run initialises this one: the BERT-as-encoder route); the table lists
  families, then variants, in order;
- `reference`: the variant whose `reference_steps` steps are a budget of 1;
- `finetune`: one block per fine-tuning target, its keys overriding the target's config:
  `classification` (`finetune/embedded.py`, scored by accuracy) and/or `seq2seq`
  (`finetune/seq2seq.py:embedded_<family>`, scored by teacher-forced perplexity and ROUGE-1/2/L);
  `scratch`: the family whose tiny model is fine-tuned from scratch on the seq2seq target
  (classification's is `finetune/embedded.py`'s model);
- `seeds` (optional, default (0,)): every run, pretraining and fine-tuning, once per seed; the
  table then gives each score's median over the seeds with the lowest and highest (the papers'
  tables are medians of several runs) and the plot the medians.

For every budget (in units of `reference_steps` of the reference) and variant, the variant gets as
many steps as the budget buys at its own cost per token, is pretrained on the embedded corpus, then
fine-tuned on each target; the from-scratch run is the zero-FLOP point. Writes `sweep.json`, a
Markdown `table.md` and `score_vs_flops.png`. Finished runs are skipped, so an interrupted sweep
continues where it stopped.

FLOPs per token are each family's nominal count (`bertology.models.flops`, ELECTRA paper style:
6·(12·L·d² + 2·L·s·d) per stack plus the MLM heads at the masked fraction; ELECTRA adds its
generator and the per-token discriminator head; NSP/SOP and SpanBERT's boundary head are left out;
an encoder-decoder counts both stacks, cross-attention and the output layer over its decoder rows,
so an objective with shorter targets buys more steps).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import pathlib
import statistics
import types
from collections.abc import Callable
from typing import Any

import ml_collections
from absl import flags

from bertology import cli, models, validation
from bertology.errors import Preempted, UserError
from bertology.files import atomic_file, atomic_write

TARGETS = ("classification", "seq2seq")
# target: (score keys in the fine-tuning results, their table headers); the last is plotted. Perplexity is
# teacher-forced on the evaluated rows (encoder-decoders only; "—" for UniLM): at a toy budget, where every
# model may decode one degenerate string, it still ranks the runs.
SCORES = {"classification": (("accuracy",), ("embedded-task accuracy",)),
          "seq2seq": (("perplexity", "rouge1", "rouge2", "rougeL"), ("perplexity", "ROUGE-1", "ROUGE-2", "ROUGE-L"))}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One pretraining recipe of a sweep: a config file (with its argument) and overrides."""

    name: str
    config: str  # "file.py[:arg]" in the sweep's configs_dir
    overrides: dict = dataclasses.field(default_factory=dict)
    init_from: str | None = None  # a config spec pretrained first, on init_share of the budget
    init_share: float = 0.5


def flops_per_token(config: ml_collections.ConfigDict, vocab_size: int) -> float:
    """Nominal training FLOPs per input token of a pretraining config with this vocabulary."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.model.vocab_size = vocab_size
    return models.flops_per_token(config, nominal=True)


def load_module(path: pathlib.Path) -> types.ModuleType:
    """A config file as a module: its `get_config`, and its `PRESETS` (the arguments that takes)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(path: pathlib.Path, *args: str) -> ml_collections.ConfigDict:
    """`get_config(*args)` of a config file, as `--config path:arg` would load it."""
    return load_module(path).get_config(*args)


def variants(c: ml_collections.ConfigDict) -> list[Variant]:
    """The sweep's variants in table order: `families` (each `<family>.py:tiny`), then `variants`."""
    out = [Variant(name=f, config=f"{f}.py:tiny") for f in c.families]
    for v in c.get("variants", ()):
        v = dict(v)
        if not {"name", "config"} <= set(v) or set(v) - {f.name for f in dataclasses.fields(Variant)}:
            raise UserError(f"sweep variant {v} must have `name` and `config` and may have `overrides`, `init_from`, "
                            "`init_share`; fix configs' variants")
        out.append(Variant(**v))
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise UserError(f"sweep variant names repeat in {names}; give each variant its own name")
    if c.reference not in names:
        raise UserError(f"reference={c.reference!r} names no variant of the sweep; use one of {', '.join(names)}")
    return out


def _load(c: ml_collections.ConfigDict, spec: str) -> ml_collections.ConfigDict:
    file, _, arg = spec.partition(":")
    path = pathlib.Path(c.configs_dir) / file
    if not path.is_file():
        raise UserError(f"sweep config {spec!r}: no file {path}; name a config in {c.configs_dir}/")
    return load_config(path, *([arg] if arg else []))


def _presets(c: ml_collections.ConfigDict, file: str) -> tuple:
    return load_module(pathlib.Path(c.configs_dir) / file).PRESETS


def _pretrain_config(c: ml_collections.ConfigDict, spec: str, steps: int, overrides: dict | None = None,
                     init: str | None = None, seed: int = 0) -> ml_collections.ConfigDict:
    """The pretraining config `spec` at the sweep's batch and length (masked predictions and
    decoder rows scaled with the length), `steps` long, then the variant's overrides; `seed`'s run."""
    pc = _load(c, spec)
    for key, least in (("max_predictions_per_seq", 1), ("max_target_length", 2)):
        if pc.data.get(key):
            ratio = pc.data[key] / pc.data.max_seq_length
            pc.data[key] = max(least, int(round(ratio * c.max_seq_length)))
    pc.data.max_seq_length = c.max_seq_length
    pc.batch_size, pc.total_steps = c.batch_size, steps
    pc.optimizer.warmup_steps = max(1, steps // 10)
    pc.eval_every, pc.checkpoint_every, pc.log_every = 0, steps, max(1, steps // 5)
    pc.mesh.shape = tuple(c.mesh_shape)
    pc.update(overrides or {})
    pc.seed = seed
    if init is not None:
        pc.init_checkpoint = init
    return pc


def _per_step(pc: ml_collections.ConfigDict) -> float:
    """Nominal FLOPs of one pretraining step of `pc` (its vocabulary's size, its batch: the sweep's
    unless the variant overrides `batch_size`, RoBERTa's batch-size table)."""
    from bertology.data.tokenizers import for_data

    return flops_per_token(pc, for_data(pc.data).vocab_size) * pc.batch_size * pc.data.max_seq_length


def plan(c: ml_collections.ConfigDict) -> list[dict[str, Any]]:
    """Every pretraining run of the sweep, without running it: per budget and variant its steps
    (those the budget buys at the variant's FLOPs per step; `init_steps` for the run it starts
    from), its batch and the FLOPs they cost."""
    vs = variants(c)
    reference = next(v for v in vs if v.name == c.reference)
    budget_flops = _per_step(_pretrain_config(c, reference.config, 1, reference.overrides)) * c.reference_steps
    runs = []
    for budget in c.budgets:
        for v in vs:
            run = {"variant": v.name, "budget": budget, "init_steps": 0, "flops": 0.0}
            own = budget * budget_flops
            if v.init_from:
                per_init = _per_step(_pretrain_config(c, v.init_from, 1))
                run["init_steps"] = max(1, int(round(v.init_share * own / per_init)))
                run["flops"] = run["init_steps"] * per_init
                own -= v.init_share * own
            pc = _pretrain_config(c, v.config, 1, v.overrides)
            per_step = _per_step(pc)
            run["steps"], run["batch"] = max(1, int(round(own / per_step))), pc.batch_size
            run["flops"] += run["steps"] * per_step
            runs.append(run)
    return runs


def _target_config(c: ml_collections.ConfigDict, target: str, family: str,
                   init: str | None, seed: int = 0) -> ml_collections.ConfigDict:
    if target == "classification":
        fc = _load(c, "finetune/embedded.py")
    else:
        # the family's own preset where finetune/seq2seq.py has one, else the default (BART's network, as MASS)
        own = f"embedded_{family}"
        fc = _load(c, f"finetune/seq2seq.py:{own if own in _presets(c, 'finetune/seq2seq.py') else 'embedded'}")
    fc.update(c.finetune[target].to_dict())
    fc.init_checkpoint, fc.seed = init, seed
    fc.mesh.shape = tuple(c.mesh_shape)
    return fc


def _finetune(c: ml_collections.ConfigDict, family: str, init: str | None, workdir: pathlib.Path,
              seed: int = 0) -> dict[str, float]:
    """Fine-tune on every target (skipping finished runs); the scores the table reports."""
    from bertology.train.finetune import finetune

    scores = {}
    for target in c.finetune:
        run = workdir / target
        if (run / "results.json").is_file():
            result = json.loads((run / "results.json").read_text())
        else:
            result = finetune(_target_config(c, target, family, init, seed), run)
        scores.update({k: result["scores"].get(k, float("nan")) for k in SCORES[target][0]})
    return scores


def _finished(run: pathlib.Path, steps: int) -> bool:
    """Whether `run` holds a checkpoint of its last step (a preempted run holds an earlier one)."""
    saved = [int(p.name) for p in (run / "checkpoints").glob("*") if p.name.isdigit()]
    return max(saved, default=-1) >= steps


def _one_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def sweep(c: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> list[dict]:
    """Pretrain and fine-tune every run of `plan(c)` under `workdir` (finished runs are skipped);
    a run that fails is recorded in its row (`failed`: the error's first line) and the sweep goes
    on; `table.md` lists it, and the sweep then ends with a UserError naming the failed runs."""
    from bertology.train.loop import train
    from bertology.train.metrics import log

    # Every run's config is checked before the first starts: a bad key would otherwise surface
    # only after the runs before it (minutes to hours), leaving a half-written sweep.
    validation.check_sweep(c)
    unknown = sorted(set(c.finetune) - set(TARGETS))
    if not c.finetune or unknown:
        raise UserError(f"finetune names targets {unknown or 'none'}; give it blocks among {', '.join(TARGETS)}")
    vs = {v.name: v for v in variants(c)}
    for v in vs.values():
        pc = _pretrain_config(c, v.config, c.reference_steps, v.overrides)
        validation.check(pc)
        if v.init_from:
            validation.check(_pretrain_config(c, v.init_from, c.reference_steps))
        for target in c.finetune:
            validation.check(_target_config(c, target, pc.model.family, None))
    workdir = pathlib.Path(workdir)
    keys = [k for t in c.finetune for k in SCORES[t][0]]

    def attempt(tag: str, row: dict, work: Callable[[], dict[str, float]]) -> dict:
        try:
            return {**row, **work()}
        except Preempted:
            raise
        except Exception as e:  # one run's failure (divergence, a crash) does not end the others
            reason = _one_line(e)
            log(f"sweep run {tag} failed, going on: {reason}")
            return {**row, **dict.fromkeys(keys, float("nan")), "failed": reason}

    def pretrain_and_finetune(run: dict, v: Variant, tag: str, seed: int) -> dict[str, float]:
        init = None
        if v.init_from:
            init = workdir / "pretrain" / f"{tag}_init"
            if not _finished(init, run["init_steps"]):
                train(_pretrain_config(c, v.init_from, run["init_steps"], seed=seed), init)
        pc = _pretrain_config(c, v.config, run["steps"], v.overrides, None if init is None else str(init), seed)
        if not _finished(workdir / "pretrain" / tag, run["steps"]):
            train(pc, workdir / "pretrain" / tag)
        return _finetune(c, pc.model.family, str(workdir / "pretrain" / tag), workdir / "finetune" / tag, seed)

    seeds = tuple(c.get("seeds", (0,)))
    suffix = (lambda seed: f"_seed{seed}") if len(seeds) > 1 else (lambda seed: "")  # one seed: the old run names
    scratch = {"variant": "scratch", "budget": 0.0, "steps": 0, "init_steps": 0, "flops": 0.0}
    rows = [attempt(f"scratch{suffix(seed)}", {**scratch, "seed": seed},
                    functools.partial(_finetune, c, c.get("scratch", "bart"), None,
                                      workdir / "finetune" / f"scratch{suffix(seed)}", seed))
            for seed in seeds]
    for run in plan(c):
        for seed in seeds:
            tag = f"{run['variant']}_x{run['budget']:g}{suffix(seed)}"
            rows.append(attempt(tag, {**run, "seed": seed},
                                functools.partial(pretrain_and_finetune, run, vs[run["variant"]], tag, seed)))
            atomic_write(workdir / "sweep.json", json.dumps(rows, indent=2))
    write_report(rows, list(c.finetune), c.reference, workdir)
    failed = ["{variant} x{budget:g}{seed_note}: {failed}".format(**r, seed_note=f" seed {r['seed']}" if len(seeds) > 1 else "")
              for r in rows if "failed" in r]
    if failed:
        raise UserError(f"{len(failed)} of {len(rows)} sweep runs failed ({'; '.join(failed)}); table.md lists them; "
                        "rerun the same command to retry them")
    return rows


def medians(rows: list[dict], keys: list[str]) -> list[dict]:
    """One row per (variant, budget) in order: each score's median over its seeds' finished runs
    (NaN where none finished) and, as `<key>_range`, the lowest and highest; `seeds` counts them."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["budget"]), []).append(r)
    out = []
    for group in groups.values():
        row = {k: v for k, v in group[0].items() if k not in ("seed", "failed", *keys)}
        row["seeds"] = len(group)
        for k in keys:
            values = [r[k] for r in group if not math.isnan(r[k])]
            row[k] = statistics.median(values) if values else math.nan
            row[f"{k}_range"] = (min(values), max(values)) if values else None
        out.append(row)
    return out


def write_report(rows: list[dict], targets: list[str], reference: str, workdir: pathlib.Path) -> None:
    """`table.md` (one row per run, a column per score; with several seeds one row per variant and
    budget, each score the median [lowest–highest]) and `score_vs_flops.png` (a panel per target,
    the medians)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for t in targets for k in SCORES[t][0]]
    headers = [h for t in targets for h in SCORES[t][1]]
    several = len({r.get("seed", 0) for r in rows}) > 1
    shown = medians(rows, keys) if several else rows

    def cell(r: dict, k: str) -> str:
        if math.isnan(r[k]):
            return "—"
        spread = r.get(f"{k}_range")
        return f"{r[k]:.2f}" + (f" [{spread[0]:.2f}–{spread[1]:.2f}]" if spread else "")

    by_batch = len({r["batch"] for r in shown if "batch" in r}) > 1  # a variant sets its own batch_size
    lines = [f"| variant | budget (× {reference} steps) | pretraining steps{' × batch' if by_batch else ''} | "
             "pretraining FLOPs | " + ("seeds | " if several else "") + " | ".join(headers) + " |",
             "|---" * (4 + several + len(keys)) + "|"]
    for r in shown:
        steps = f"{r['init_steps']} + {r['steps']}" if r.get("init_steps") else str(r["steps"])
        if by_batch and "batch" in r:
            steps += f" × {r['batch']}"
        seeds = f"{r['seeds']} | " if several else ""
        lines.append(f"| {r['variant']} | {r['budget']:g} | {steps} | {r['flops']:.2e} | {seeds}"
                     + " | ".join(cell(r, k) for k in keys) + " |")
    if several:
        lines += ["", "Each score: the median over the seeds' runs [lowest–highest]."]
    failed = [f"- {r['variant']} × {r['budget']:g}" + (f" seed {r['seed']}" if several else "") + f": {r['failed']}"
              for r in rows if "failed" in r]
    if failed:
        lines += ["", "Failed runs (rerun the sweep to retry them):", *failed]
    atomic_write(workdir / "table.md", "\n".join(lines) + "\n")
    fig, axes = plt.subplots(1, len(targets), figsize=(6 * len(targets), 4), squeeze=False)
    scratch = shown[0]
    for ax, target in zip(axes[0], targets):
        key, label = SCORES[target][0][-1], SCORES[target][1][-1]  # accuracy; ROUGE-L
        for variant in dict.fromkeys(r["variant"] for r in shown[1:]):
            pts = sorted((r["flops"], r[key]) for r in shown if r["variant"] == variant)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=variant)
        ax.axhline(scratch[key], color="gray", linestyle="--", label="from scratch")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        ax.set_xlim(0, 1.1 * max(r["flops"] for r in shown))
        ax.set_xlabel("pretraining FLOPs")
        ax.set_ylabel(f"{label} (%)" + (" (median over seeds)" if several else ""))
        ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_file(workdir / "score_vs_flops.png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def _define(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", "runs/sweep", "Pretraining runs, fine-tuning runs, table and plot.", flag_values=fv)


def _main(fv: flags.FlagValues) -> None:
    rows = sweep(fv.config, fv.workdir)
    print((pathlib.Path(fv.workdir) / "table.md").read_text())
    print(f"{len(rows)} runs; plot in {fv.workdir}/score_vs_flops.png")


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status."""
    return cli.run("bertology.sweep", _main, _define, argv)


if __name__ == "__main__":
    cli.end_process(main())
