"""The miniature replication: pretrain each tiny family at equal FLOPs, fine-tune each, compare.

    python -m bertology.sweep --config configs/sweep/equal_flops.py --workdir runs/sweep

For every budget (in units of `reference_steps` of tiny BERT) and family, the family's tiny config
gets as many steps as the budget buys at its own cost per token, is pretrained on the embedded
corpus, then fine-tuned on the embedded task; a from-scratch run is the zero-FLOP point. Writes
`sweep.json`, a Markdown `table.md` and `score_vs_flops.png`. Finished runs are skipped, so an
interrupted sweep continues where it stopped.

FLOPs per token are each family's nominal count (`bertology.models.flops`, ELECTRA paper style:
6·(12·L·d² + 2·L·s·d) per stack plus the MLM heads at the masked fraction; ELECTRA adds its
generator and the per-token discriminator head; NSP/SOP and SpanBERT's boundary head are left out).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import ml_collections
from absl import flags

from bertology import cli, models, validation


def flops_per_token(config: ml_collections.ConfigDict, vocab_size: int) -> float:
    """Nominal training FLOPs per input token of a pretraining config with this vocabulary."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.model.vocab_size = vocab_size
    return models.flops_per_token(config, nominal=True)


def load_config(path: pathlib.Path, *args: str) -> ml_collections.ConfigDict:
    """`get_config(*args)` of a config file, as `--config path:arg` would load it."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)


def _pretrain_config(c: ml_collections.ConfigDict, family: str, steps: int) -> ml_collections.ConfigDict:
    pc = load_config(pathlib.Path(c.configs_dir) / f"{family}.py", "tiny")
    ratio = pc.data.max_predictions_per_seq / pc.data.max_seq_length
    pc.data.max_seq_length = c.max_seq_length
    pc.data.max_predictions_per_seq = max(1, int(round(ratio * c.max_seq_length)))
    pc.batch_size, pc.total_steps = c.batch_size, steps
    pc.optimizer.warmup_steps = max(1, steps // 10)
    pc.eval_every, pc.checkpoint_every, pc.log_every = 0, steps, max(1, steps // 5)
    pc.mesh.shape = tuple(c.mesh_shape)
    return pc


def _finetune_config(c: ml_collections.ConfigDict, init: str | None) -> ml_collections.ConfigDict:
    fc = load_config(pathlib.Path(c.configs_dir) / "finetune" / "embedded.py")
    fc.update(c.finetune.to_dict())
    fc.init_checkpoint = init
    fc.mesh.shape = tuple(c.mesh_shape)
    return fc


def _finetune(c: ml_collections.ConfigDict, init: str | None, workdir: pathlib.Path) -> dict:
    from bertology.train.finetune import finetune

    if (workdir / "results.json").is_file():
        return json.loads((workdir / "results.json").read_text())
    return finetune(_finetune_config(c, init), workdir)


def sweep(c: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> list[dict]:
    from bertology.data.tokenizers import for_data
    from bertology.train.loop import train

    # Every run's config is checked before the first starts: a bad key would otherwise surface
    # only after the runs before it (minutes to hours), leaving a half-written sweep.
    validation.check_sweep(c)
    for family in c.families:
        validation.check(_pretrain_config(c, family, c.reference_steps))
    validation.check(_finetune_config(c, None))
    workdir = pathlib.Path(workdir)
    reference = _pretrain_config(c, "bert", c.reference_steps)
    per_ref_step = flops_per_token(reference, for_data(reference.data).vocab_size)
    per_ref_step *= c.batch_size * c.max_seq_length
    scratch = _finetune(c, None, workdir / "finetune" / "scratch")
    rows = [{"family": "scratch", "budget": 0.0, "steps": 0, "flops": 0.0, "score": scratch["scores"]["accuracy"]}]
    for budget in c.budgets:
        for family in c.families:
            probe = _pretrain_config(c, family, 1)
            vocab = for_data(probe.data).vocab_size
            per_step = flops_per_token(probe, vocab) * c.batch_size * c.max_seq_length
            steps = max(1, int(round(budget * per_ref_step * c.reference_steps / per_step)))
            run = workdir / "pretrain" / f"{family}_x{budget:g}"
            if not (run / "checkpoints").is_dir() or not any((run / "checkpoints").iterdir()):
                train(_pretrain_config(c, family, steps), run)
            result = _finetune(c, str(run), workdir / "finetune" / f"{family}_x{budget:g}")
            rows.append({"family": family, "budget": budget, "steps": steps, "flops": steps * per_step,
                         "score": result["scores"]["accuracy"]})
            (workdir / "sweep.json").write_text(json.dumps(rows, indent=2))
    write_report(rows, workdir)
    return rows


def write_report(rows: list[dict], workdir: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["| family | budget (× tiny-BERT steps) | pretraining steps | pretraining FLOPs | embedded-task accuracy |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['budget']:g} | {r['steps']} | {r['flops']:.2e} | {r['score']:.2f} |" for r in rows]
    (workdir / "table.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    base = rows[0]["score"]
    for family in dict.fromkeys(r["family"] for r in rows[1:]):
        pts = sorted((r["flops"], r["score"]) for r in rows if r["family"] == family)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=family)
    ax.axhline(base, color="gray", linestyle="--", label="from scratch")
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    ax.set_xlim(0, 1.1 * max(r["flops"] for r in rows))
    ax.set_xlabel("pretraining FLOPs")
    ax.set_ylabel("embedded-task accuracy (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(workdir / "score_vs_flops.png", dpi=120)


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
    sys.exit(main())
