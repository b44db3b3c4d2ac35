"""Each process of a multi-process run trains in a child of a small supervising process, for the
one fault a training process cannot report itself: the loss of process 0, which hosts jax's
coordination service. When process 0 dies (kill -9, a crashed host), jax's runtime aborts every
other process within a second, before the `Watchdog` can act: "Terminating process because the
JAX distributed service detected fatal errors", a C++ stack trace and signal 6, 0.2-0.3 s after
a kill -9 of process 0 (measured on jax 0.10.2; its missed-heartbeat callback and
`jax_enable_recoverability` do not prevent it). A scheduler reads signal 6 as a crash, not as a
lost peer to requeue. The parent, which imports no jax, turns exactly that death into the
Watchdog's kind of line and EXIT_LOST_PEER, and passes everything else through: the child's
output (its stderr line by line, less the runtime's stack trace after that abort), its exit
status, and SIGTERM (preemption: the child checkpoints, then exits 143). torchrun's agent plays
the same part for PyTorch's rendezvous store.

The child dies with its parent (Linux's parent-death signal), so killing the parent, as a
scheduler or a test does, never leaves a training process behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

SUPERVISED = "BERTOLOGY_SUPERVISED"  # set in the child: it trains instead of supervising again
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
# sysexits.h's EX_TEMPFAIL, "a temporary failure; retry": the job lost a process, not its recipe
EXIT_LOST_PEER = 75
RUNTIME_ABORT = b"JAX distributed service detected fatal errors"
_PR_SET_PDEATHSIG = 1


def in_slurm_job_step() -> bool:
    """Inside `srun` with more than one task (one sbatch task alone is a single-host run)."""
    return all(v in os.environ for v in SLURM_VARS) and int(os.environ["SLURM_NTASKS"]) > 1


def wanted(argv: list[str]) -> bool:
    """Whether this command line (program name first) starts one process of a multi-process run
    that is not supervised yet: --coordinator or --distributed given, or a SLURM job step."""
    if os.environ.get(SUPERVISED) or any(a in ("-h", "--help") for a in argv[1:]):
        return False
    flags = [a.split("=", 1) for a in argv[1:]]
    given = {f[0]: (f[1] if len(f) > 1 else "true") for f in flags}
    return ("--coordinator" in given or given.get("--distributed", "false").lower() in ("true", "1")
            or in_slurm_job_step())


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def supervise(prog: str, module: str, argv: list[str]) -> int:
    """Run `python -m module argv[1:]` as the supervised child and return the exit status this
    process should end with (see the module docstring)."""
    child = subprocess.Popen([sys.executable, "-m", module, *argv[1:]], env={**os.environ, SUPERVISED: "1"},
                             stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    # A scheduler's SIGTERM may reach only this process (Kubernetes signals the container's first
    # process); the child, in the same process group, gets a terminal's Ctrl-C by itself.
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    aborted = False
    assert child.stderr is not None
    for line in iter(child.stderr.readline, b""):
        aborted = aborted or RUNTIME_ABORT in line
        if not aborted:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
    status = child.wait()
    if aborted and status == -signal.SIGABRT:
        print(f"{prog}: error: lost the coordinator (process 0), which ended; rerun the whole job to resume "
              "from the last complete checkpoint", file=sys.stderr, flush=True)
        return EXIT_LOST_PEER
    return status if status >= 0 else 128 - status
