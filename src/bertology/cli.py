"""What the command-line entry points share: flag parsing and one-line errors.

Configs are python files (`--config configs/bert.py:tiny`) with `--config.a.b=v` overrides, as in
big_vision. Any bad input (unknown key, unknown preset, missing file) ends the program with one
line on stderr naming the problem, exit status 2, and no traceback.

Exit statuses: 0 finished; 2 bad input (`UserError`, one line); 3 diverged (`Diverged`, one line);
130 Ctrl-C; 143 (128 + SIGTERM,
what a shell reports for a process SIGTERM ended) stopped by SIGTERM: the run wrote a
checkpoint and wants to be requeued (a pod or SLURM's `--requeue` can tell it from a finished
run). While `main` runs, SIGTERM raises `Preempted`; a training loop defers it until its
checkpoint is written (`bertology.train.run.Preemption`), so every CLI that trains gets 143
without doing anything itself; its `__main__` exits through `end_process`.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Callable, NoReturn

from absl import flags
from ml_collections import ConfigDict, config_flags

from bertology import config_help
from bertology.errors import SIGTERM_RECEIVED, Diverged, Preempted, UserError

EXIT_DIVERGED = 3
EXIT_PREEMPTED = 128 + signal.SIGTERM
HELP_FLAGS = ("-h", "--help")


def end_process(status: int) -> NoReturn:
    """Exit a training command with `status` (its `main()`'s). A run that stopped early (preempted,
    bad input, diverged) ends without the interpreter's teardown: with XLA's, TensorFlow's or
    orbax's threads still running, that teardown crashed with signal 11 (a SIGTERM during
    start-up, about one time in five), which a scheduler reads as a crash, not a preemption to
    requeue, or printed a traceback after the one-line error (a full disk during a checkpoint
    write: "sys.meta_path is None, Python is likely shutting down"). By then `main` has closed
    and released everything it wrote (checkpoint, metrics, the run lock). A finished run (0)
    exits normally."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status != 0:
        os._exit(status)
    sys.exit(status)


def _clean(message: str) -> str:
    """absl wraps config errors in several layers; keep the innermost, first line."""
    message = str(message).strip().splitlines()[0] if str(message).strip() else "invalid flags"
    for marker in ("UserError: ", "ValueError: ", "KeyError: "):
        if marker in message:
            message = message.rsplit(marker, 1)[1]
    return message


def _config_spec(argv: list[str]) -> str | None:
    """--config's value (`configs/bert.py:tiny`), or None."""
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_key(message: str, argv: list[str]) -> str:
    """One line for ml_collections' error on an override of a missing key. Its message quotes the
    key and may add a line `Did you mean "share_layers" instead of "scan_layers"?`, kept as the fix."""
    found = re.search(r"'(\w+)\\?'", message)  # the quotes may come escaped, as in a repr
    key = found.group(1) if found else message.strip("\"'")
    flag = next((a.split("=")[0] for a in argv if a.startswith("--config.") and key in a.split("=")[0].split(".")),
                f"--config...{key}")
    close = re.search(r'Did you mean "(\w+)"', message)
    fix = f'did you mean "{close.group(1)}"?' if close else "check the spelling against the config file"
    return f"unknown config key {flag[len('--config.'):]!r} ({flag}); {fix}"


def _preempted(signum: int, frame: object) -> None:
    SIGTERM_RECEIVED.set()
    raise Preempted("stopped by SIGTERM; rerun the same command to resume from the last checkpoint")


def wants_help(argv: list[str]) -> bool:
    """Whether a command line (program name first) asks for help: absl's own FlagValues has no help flag."""
    return any(a in HELP_FLAGS for a in argv[1:])


def flags_help(prog: str, doc: str | None, fv: flags.FlagValues) -> str:
    """A command's usage: its docstring and its flags with their help texts and defaults."""
    shown = [f"  --{name}: {fv[name].help} (default: {fv[name].default!r})" for name in fv if fv[name].name == name]
    return f"usage: {prog} [flags]\n\n{(doc or '').strip()}\n\nflags:\n" + "\n".join(shown)


def run_flags(prog: str, doc: str | None, fv: flags.FlagValues, main: Callable[[flags.FlagValues], None],
              argv: list[str] | None = None) -> int:
    """A command without a config (features, generate, harness): with --help (or -h) print its
    usage and flags; else parse `argv` (program name first; default sys.argv) into `fv` and call
    `main(fv)`. Bad input (a `UserError`, a flag error) ends with one line and status 2."""
    argv = sys.argv if argv is None else argv
    if wants_help(argv):
        print(flags_help(prog, doc, fv))
        return 0

    def parsed_then_main() -> None:
        fv(argv)
        main(fv)

    return guarded(prog, parsed_then_main)


def guarded(prog: str, work: Callable[[], None]) -> int:
    """Status 0 when `work()` returns; bad input (a `UserError`, a flag error) ends it with one
    line on stderr, `<prog>: error: <the problem and its fix>`, and status 2. The commands that
    parse with argparse (convert, tokenizer, analyze, ...) run their work through this too, so
    every command reports bad input the same way."""
    try:
        work()
    except (UserError, flags.Error) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


def _load(fv: flags.FlagValues, argv: list[str]) -> ConfigDict | None:
    """Parse `argv` into `fv`; the loaded config, or None without --config."""
    try:
        fv(argv)
        config = fv.config
        if config is not None:
            config.to_dict()  # a config that failed to load only raises when first used
        return config
    except (AttributeError, KeyError) as e:  # ml_collections: an override names a missing key
        raise UserError(_unknown_key(str(e), argv)) from None
    except OSError:  # ml_collections could not load the config file
        path = (_config_spec(argv) or "").split(":")[0]
        raise UserError(f"config file not found: {path}; e.g. --config configs/bert.py:tiny") from None


def _help(prog: str, main: Callable[[flags.FlagValues], None], fv: flags.FlagValues, argv: list[str],
          default_config: Callable[[], ConfigDict] | None) -> None:
    """Print the command's usage, flags and config keys: --config's if given, else `default_config()`'s."""
    argv = [a for a in argv if a not in HELP_FLAGS]

    def build() -> ConfigDict | None:
        config = _load(fv, argv)
        return default_config() if config is None and default_config else config

    spec = _config_spec(argv)
    config, docs = config_help.documented(build, spec and spec.split(":")[0])
    print(flags_help(prog, sys.modules[main.__module__].__doc__, fv))
    if config is None:
        print("\nconfig keys: give --config FILE with --help to list them")
        return
    print(f"\nconfig: {spec or 'the default (--config FILE --help lists the keys of FILE)'}")
    print(config_help.describe(config, docs))


def run(prog: str, main: Callable[[flags.FlagValues], None], define: Callable[[flags.FlagValues], None] | None = None,
        argv: list[str] | None = None, default_config: Callable[[], ConfigDict] | None = None) -> int:
    """Parse flags (`--config` plus whatever `define` adds), then call `main(FLAGS)`. With --help
    (or -h) print the usage, the flags and the config's keys (those of `default_config()` when no
    --config is given) instead, and return 0."""
    argv = sys.argv if argv is None else argv
    fv = flags.FlagValues()
    # sys_argv: the --config.* overrides are read from `argv`, not the process's own command line.
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/bert.py:tiny", flag_values=fv,
                                    sys_argv=argv)
    if define:
        define(fv)
    try:
        if wants_help(argv):
            _help(prog, main, fv, argv, default_config)
            return 0
        if _load(fv, argv) is None:
            raise UserError("no --config given; e.g. --config configs/bert.py:tiny")
        SIGTERM_RECEIVED.clear()
        previous = signal.signal(signal.SIGTERM, _preempted)
        try:
            main(fv)
        finally:
            signal.signal(signal.SIGTERM, previous)
            SIGTERM_RECEIVED.clear()  # this run's: a later run in the same process starts afresh
    except Preempted as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except (UserError, flags.Error) as e:
        print(f"{prog}: error: {_clean(e)}", file=sys.stderr)
        return EXIT_DIVERGED if isinstance(e, Diverged) else 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0
