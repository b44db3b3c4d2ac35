"""The one exception type for bad input.

CLIs catch `UserError` and print its message as a single line (no traceback), so every message
must name the problem and the fix.
"""

import threading


class UserError(Exception):
    """Bad input from the user: a missing file, an empty corpus, an unknown key, a mismatch."""


class Diverged(UserError):
    """Training stopped because its loss or gradient stayed NaN or inf (`max_nonfinite_steps` in a
    row): one line like any `UserError`, but its own exit status (`bertology.cli.EXIT_DIVERGED`),
    since rerunning the same command would diverge again."""


class Preempted(Exception):
    """The run was stopped by SIGTERM (a pod's or scheduler's preemption), after writing a
    checkpoint if it was training. CLIs exit with `bertology.cli.EXIT_PREEMPTED` so a scheduler
    can tell it from a finished run and requeue it."""


# Set by the CLI's SIGTERM handler before it raises `Preempted`. Where Python swallows that exception
# (the handler ran inside a garbage-collection callback, as jax's during start-up: "Exception ignored
# in _xla_gc_callback", and the run trained on to its end), the training loop still sees the request
# when it starts (`bertology.train.run.Preemption`) and checkpoints after its first step.
SIGTERM_RECEIVED = threading.Event()
