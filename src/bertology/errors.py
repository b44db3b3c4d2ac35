"""The one exception type for bad input.

CLIs catch `UserError` and print its message as a single line (no traceback), so every message
must name the problem and the fix.
"""


class UserError(Exception):
    """Bad input from the user: a missing file, an empty corpus, an unknown key, a mismatch."""


class Preempted(Exception):
    """The run was stopped by SIGTERM (a pod's or scheduler's preemption), after writing a
    checkpoint if it was training. CLIs exit with `bertology.cli.EXIT_PREEMPTED` so a scheduler
    can tell it from a finished run and requeue it."""
