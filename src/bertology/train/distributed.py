"""Joining the processes of a multi-host run into one JAX runtime, before any device is touched.

Three ways in, tried in this order: explicit `--coordinator/--num_processes/--process_id` (any
cluster, and the localhost test); `--distributed`, which lets JAX detect the cluster itself
(Cloud TPU VM pods, SLURM, Open MPI, Kubernetes); and SLURM detected from its environment
when the job step has more than one task, so an sbatch script needs no extra flag. A single
process initialises nothing, so one-host runs behave exactly as before.

After this, `jax.devices()` lists every device of every host, each process feeds only its own
rows (`PretrainingStream(process_index=...)`), and only process 0 logs or writes metrics.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertology.errors import UserError

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    auto: bool = False,
) -> bool:
    """Call `jax.distributed.initialize` if this is a multi-process run; True if it was called."""
    explicit = (coordinator, num_processes, process_id)
    if any(x is not None for x in explicit):
        if any(x is None for x in explicit):
            raise UserError("--coordinator, --num_processes and --process_id go together; give all three or none")
        if not 0 <= process_id < num_processes:
            raise UserError(f"--process_id {process_id} is outside 0..{num_processes - 1}")
        jax.distributed.initialize(coordinator, num_processes, process_id)
        return True
    if auto or in_slurm_job_step():
        jax.distributed.initialize()
        return True
    return False


def in_slurm_job_step() -> bool:
    """Inside `srun` with more than one task (one sbatch task alone is a single-host run)."""
    return all(v in os.environ for v in SLURM_VARS) and int(os.environ["SLURM_NTASKS"]) > 1


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is true on any: so all stop at the same step (a SIGTERM
    reaching one host first must not leave the others waiting in a collective)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.array([flag]))))
