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
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertology.errors import UserError
from bertology.train.supervisor import EXIT_LOST_PEER, in_slurm_job_step

HEARTBEAT_TIMEOUT = 100  # seconds, jax.distributed's own default
HEARTBEATS = "bertology/heartbeat/"


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    auto: bool = False,
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT,
    prog: str = "bertology",
) -> bool:
    """Call `jax.distributed.initialize` if this is a multi-process run; True if it was called.
    Then a `Watchdog` ends this process with one line and EXIT_LOST_PEER when another one has
    been silent for `heartbeat_timeout` seconds."""
    if heartbeat_timeout < 1:
        raise UserError(f"--heartbeat_timeout={heartbeat_timeout}; give seconds, at least 1 "
                        f"(default {HEARTBEAT_TIMEOUT})")
    # the runtime's own detection aborts with a C++ stack trace, so it stays only as the backstop.
    # The missed-heartbeat callback that would replace the abort is no way out in jax 0.10.2:
    # jax.distributed.initialize does not pass one, and one given to the client directly aborts
    # all the same (std::bad_cast: its absl::Status argument has no Python type; measured).
    backstop = 2 * heartbeat_timeout + 30
    explicit = (coordinator, num_processes, process_id)
    if any(x is not None for x in explicit):
        if any(x is None for x in explicit):
            raise UserError("--coordinator, --num_processes and --process_id go together; give all three or none")
        if not 0 <= process_id < num_processes:
            raise UserError(f"--process_id {process_id} is outside 0..{num_processes - 1}")
        jax.distributed.initialize(coordinator, num_processes, process_id, heartbeat_timeout_seconds=backstop)
    elif auto or in_slurm_job_step():
        jax.distributed.initialize(heartbeat_timeout_seconds=backstop)
    else:
        return False
    from jax._src.distributed import global_state

    Watchdog(global_state.client, jax.process_index(), jax.process_count(), heartbeat_timeout, prog).start()
    return True


class Watchdog(threading.Thread):
    """Lost processes end the run instead of hanging it. Without this, the others wait in their
    next collective until the runtime's heartbeat check aborts them with a C++ stack trace and
    signal 6 (90 s after a kill -9 with jax's defaults, measured): a crash to a scheduler.

    Every `timeout / 5` seconds each process bumps its own counter in the coordination service's
    key-value store and reads everyone's (one call each). A peer whose counter has not moved for
    `timeout` seconds (on this process's clock: hosts' clocks need not agree), or a coordinator
    that has not answered for `timeout` seconds, is lost: one line naming it on stderr, then
    EXIT_LOST_PEER, from this thread, whatever the main thread is blocked in. A separate judge
    thread keeps time, so a call that hangs on a vanished coordinator cannot stall the verdict."""

    def __init__(self, client: Any, me: int, count: int, timeout: float, prog: str):
        super().__init__(name="bertology-watchdog", daemon=True)
        self.client, self.me, self.timeout, self.prog = client, me, timeout, prog
        now = time.monotonic()
        self.answered = now  # when the coordination service last answered
        self.moved = {p: ("", now) for p in range(count) if p != me}  # each peer's last counter and when it moved

    def run(self) -> None:
        threading.Thread(target=self._judge, name="bertology-watchdog-judge", daemon=True).start()
        beat = 0
        while True:
            beat += 1
            try:
                self.client.key_value_set(f"{HEARTBEATS}{self.me}", str(beat), allow_overwrite=True)
                values = dict(self.client.key_value_dir_get(HEARTBEATS))
            except Exception:  # the service is gone or unreachable; the judge counts the silence
                pass
            else:
                now = time.monotonic()
                self.answered = now
                for peer, (last, _) in self.moved.items():
                    value = values.get(f"{HEARTBEATS}{peer}", "")
                    if value != last:
                        self.moved[peer] = (value, now)
            time.sleep(self.timeout / 5)

    def _judge(self) -> None:
        # process 0 hosts the coordination service: were it to exit first, the runtime would abort
        # every other process at once (signal 6, a stack trace) before their own verdicts, so it
        # waits longer and lets them go first, each with its line and EXIT_LOST_PEER. The same
        # abort is what a kill -9 of process 0 brings the others, 0.2-0.3 s after it, too soon
        # for anything here: `supervisor` turns that death into the line and EXIT_LOST_PEER. A
        # process 0 that freezes or becomes unreachable instead is caught here: its peers stop
        # in `timeout` with this line.
        patience = self.timeout * (1.5 if self.me == 0 else 1.0)
        while True:
            time.sleep(self.timeout / 10)
            now = time.monotonic()
            lost = [p for p, (_, since) in self.moved.items() if now - since >= patience]
            if now - self.answered >= self.timeout:
                who = "the coordinator (process 0), which stopped answering"
            elif lost:
                who = f"process {', '.join(map(str, lost))}, silent"
            else:
                continue
            print(f"{self.prog}: error: lost {who} for {patience:g} s (--heartbeat_timeout); rerun the whole "
                  "job to resume from the last complete checkpoint", file=sys.stderr, flush=True)
            os._exit(EXIT_LOST_PEER)


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is true on any: so all stop at the same step (a SIGTERM
    reaching one host first must not leave the others waiting in a collective)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.array([flag]))))
