"""Fine-tune an encoder on a downstream task and score it as its leaderboard does.

    python -m bertology.finetune --config configs/finetune/glue.py:sst2 --config.init_checkpoint=runs/tiny --workdir runs/sst2
    python -m bertology.finetune --config configs/finetune/embedded.py --workdir runs/ft_embedded

Without init_checkpoint the encoder starts from random weights. Results go to WORKDIR/results.json
(plus GLUE submission TSVs or SQuAD prediction JSON); `--summary DIR...` prints a table of runs.
"""

from __future__ import annotations

import json
import pathlib
import sys

from absl import flags
from ml_collections import ConfigDict

from bertology import cli


def _define(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", "runs/finetune", "results.json, metrics.jsonl and predictions go here.", flag_values=fv)


def _main(fv: flags.FlagValues) -> None:
    from bertology.train.finetune import finetune

    result = finetune(fv.config, fv.workdir)
    scores = " | ".join(f"{k} {v:.2f}" for k, v in result["scores"].items())
    print(f"done: {result['task']} ({result['mode']}, {result['steps']} steps): {scores}; results in {fv.workdir}/results.json")


def summary(workdirs: list[str]) -> str:
    """A Markdown table of several runs' results.json."""
    from bertology.errors import UserError
    from bertology.evaluation.outputs import summary_table


    rows = []
    for d in workdirs:
        path = pathlib.Path(d) / "results.json"
        if not path.is_file():
            raise UserError(f"{path} not found; pass the --workdir of finished fine-tuning runs")
        rows.append(json.loads(path.read_text()))
    return summary_table(rows)


def _summary_main(workdirs: list[str]) -> int:
    return cli.guarded("bertology.finetune", lambda: print(summary(workdirs)))


def help_config() -> ConfigDict:
    """What --help lists without --config (here and in bertology.grid): fine-tuning's keys, on the
    embedded task (each configs/finetune/*.py names a task and changes a few)."""
    from bertology.train.finetune import default_config

    return default_config("embedded")


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status."""
    argv = sys.argv if argv is None else argv
    if argv[1:2] == ["--summary"]:
        return _summary_main(argv[2:])
    return cli.run("bertology.finetune", _main, _define, argv, help_config)


if __name__ == "__main__":
    cli.end_process(main())
