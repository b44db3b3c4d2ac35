"""Score a run on lm-evaluation-harness tasks (EleutherAI's lm-eval): its catalogue (HellaSwag,
LAMBADA, ARC, WikiText, ...) or tasks of your own in YAML.

    python -m bertology.harness --run runs/gpt_tiny --tasks lambada_openai,hellaswag \\
        [--include_path my_tasks/ --num_fewshot 0 --limit 100 --batch_size 8 --out results.json]

Runs `lm_eval.simple_evaluate` with the model "bertology" (`bertology.evaluation.harness`: causal
LMs, encoder-decoders and UniLM), prints lm-eval's table, and writes its results as JSON to
`--out` (atomically). Needs the optional extra: pip install "bertology[lm-eval]". Bad input ends
with one line and exit status 2.
"""

from __future__ import annotations

import sys

from absl import flags

from bertology import cli
from bertology.errors import UserError


def _flags() -> flags.FlagValues:
    fv = flags.FlagValues()
    flags.DEFINE_string("run", None, "A run directory (config.json + checkpoints/): causal LM, encoder-decoder or "
                        "UniLM.", flag_values=fv)
    flags.DEFINE_list("tasks", [], "lm-eval task (or group) names, comma-separated.", flag_values=fv)
    flags.DEFINE_string("include_path", None, "A directory of task YAML files of your own, added to lm-eval's.",
                        flag_values=fv)
    flags.DEFINE_float("limit", None, "Score only the first N examples of each task (a fraction if below 1).",
                       flag_values=fv)
    flags.DEFINE_integer("num_fewshot", None, "Examples in each prompt; default: each task's own.", flag_values=fv)
    flags.DEFINE_integer("batch_size", 8, "Requests per batch.", flag_values=fv)
    flags.DEFINE_integer("step", None, "The checkpoint to score; default: the latest.", flag_values=fv)
    flags.DEFINE_string("out", None, "Write lm-eval's results here as JSON.", flag_values=fv)
    return fv


def _main(fv: flags.FlagValues) -> None:
    if not fv.run or not fv.tasks:
        raise UserError("--run and --tasks are required, e.g. --run runs/gpt_tiny --tasks lambada_openai")
    from bertology.evaluation.harness import describe, evaluate, write_results

    limit = None if fv.limit is None else int(fv.limit) if fv.limit >= 1 else fv.limit
    results = evaluate(fv.run, fv.tasks, include_path=fv.include_path, num_fewshot=fv.num_fewshot, limit=limit,
                       batch_size=fv.batch_size, step=fv.step)
    if fv.out:
        write_results(results, fv.out)
    print(describe(results))


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status."""
    return cli.run_flags("bertology.harness", __doc__, _flags(), _main, argv)


if __name__ == "__main__":
    sys.exit(main())
