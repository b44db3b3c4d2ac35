"""Pretrain a BERT-family model.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/tiny [--config.total_steps=200]

Rerunning with the same --workdir resumes from its latest checkpoint.

Multi-host: run the same command on every host. On a TPU pod add --distributed; under SLURM
(srun, several tasks) nothing is needed; elsewhere pass --coordinator=HOST:PORT
--num_processes=N --process_id=I (see bertology.train.distributed and launch/).
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import ConfigDict

from bertology import cli


def _define(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", "runs/default", "Checkpoints, metrics.jsonl and TensorBoard files go here.", flag_values=fv)
    flags.DEFINE_string("coordinator", None, "HOST:PORT of process 0, for a multi-process run.", flag_values=fv)
    flags.DEFINE_integer("num_processes", None, "How many processes the run has (with --coordinator).", flag_values=fv)
    flags.DEFINE_integer("process_id", None, "This process's index, 0..num_processes-1 (with --coordinator).",
                         flag_values=fv)
    flags.DEFINE_bool("distributed", False, "Let JAX detect the cluster (TPU pod, SLURM, MPI) and join it.",
                      flag_values=fv)
    flags.DEFINE_integer("heartbeat_timeout", 100, "Seconds without a heartbeat after which a multi-process run "
                         "counts a process as lost and stops every other one (exit status 75).", flag_values=fv)


def _main(fv: flags.FlagValues) -> None:
    from bertology.train import distributed

    distributed.initialize(fv.coordinator, fv.num_processes, fv.process_id, auto=fv.distributed,
                           heartbeat_timeout=fv.heartbeat_timeout, prog="bertology.pretrain")
    from bertology.train.loop import train
    from bertology.train.metrics import log

    summary = train(fv.config, fv.workdir)
    history = summary["history"]
    if history:
        log(f"done: step {summary['step']}, loss {history[0]['loss']:.4f} (step {history[0]['step']}) -> "
            f"{history[-1]['loss']:.4f} (step {history[-1]['step']}); metrics in {fv.workdir}/metrics.jsonl")


def help_config() -> ConfigDict:
    """What --help lists without --config: the keys every pretraining config shares, at BERT tiny's
    values (configs/bert.py:tiny; the configs/ files are not part of the installed package)."""
    from bertology import recipes
    from bertology.models.presets import bert_preset

    return recipes.pretraining(bert_preset("tiny"), family="bert", objective="bert", paper=False)


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status. One
    process of a multi-process run trains in a supervised child (`bertology.train.supervisor`)."""
    from bertology.train import supervisor

    argv = sys.argv if argv is None else argv
    if supervisor.wanted(argv):
        return supervisor.supervise("bertology.pretrain", "bertology.pretrain", argv)
    return cli.run("bertology.pretrain", _main, _define, argv, help_config)


if __name__ == "__main__":
    cli.end_process(main())
