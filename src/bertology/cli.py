"""What the command-line entry points share: flag parsing and one-line errors.

Configs are python files (`--config configs/bert.py:tiny`) with `--config.a.b=v` overrides, as in
big_vision. Any bad input (unknown key, unknown preset, missing file) ends the program with one
line on stderr naming the problem, exit status 2, and no traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import flags
from ml_collections import config_flags

from bertology.errors import UserError


def _clean(message: str) -> str:
    """absl wraps config errors in several layers; keep the innermost, first line."""
    message = str(message).strip().splitlines()[0] if str(message).strip() else "invalid flags"
    for marker in ("UserError: ", "ValueError: ", "KeyError: "):
        if marker in message:
            message = message.rsplit(marker, 1)[1]
    return message


def run(prog: str, main: Callable[[flags.FlagValues], None], define: Callable[[], None] | None = None,
        argv: list[str] | None = None) -> int:
    """Parse flags (`--config` plus whatever `define` adds), then call `main(FLAGS)`."""
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/bert.py:tiny", flag_values=fv)
    if define:
        define(fv)
    argv = sys.argv if argv is None else argv
    try:
        fv(argv)
        if fv.config is None:
            raise UserError("no --config given; e.g. --config configs/bert.py:tiny")
        main(fv)
    except (UserError, flags.Error) as e:
        print(f"{prog}: error: {_clean(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0
