"""The one exception type for bad input.

CLIs catch `UserError` and print its message as a single line (no traceback), so every message
must name the problem and the fix.
"""


class UserError(Exception):
    """Bad input from the user: a missing file, an empty corpus, an unknown key, a mismatch."""
