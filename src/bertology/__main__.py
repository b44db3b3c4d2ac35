"""`bertology COMMAND ...` (or `python -m bertology COMMAND ...`): every entry point under one name.

    bertology pretrain --config configs/bert.py:tiny --workdir runs/tiny
    bertology finetune --config configs/finetune/embedded.py --workdir runs/ft
    bertology --help                  # the commands; `bertology COMMAND --help` for one's flags and config keys
    bertology --version

Each command is the module of the same name (`python -m bertology.pretrain ...` runs the same
code): this only picks it and hands it the command line as `sys.argv`, so its flags, errors and
exit statuses are its own.
"""

from __future__ import annotations

import importlib
import sys

from bertology import __version__

# command -> what it does (the module `bertology.<command>` runs it)
COMMANDS = {
    "pretrain": "pretrain a model from a config (configs/<family>.py:<preset>)",
    "finetune": "fine-tune a run on a task and score it as its leaderboard does",
    "grid": "fine-tune over learning rates x seeds; medians and the GLUE score card",
    "sweep": "pretrain variants at equal FLOPs, fine-tune each, tabulate and plot",
    "generate": "continue prompts with a causal LM, or map sources to targets",
    "convert": "Hugging Face checkpoints to and from bertology runs",
    "features": "contextual embeddings of sentences from any run",
    "tokenizer": "train a tokenizer, or show how one splits some text",
    "analyze": "attention maps, probes, contextual similarity, training curves, loss surfaces",
    "harness": "score a causal LM, encoder-decoder or UniLM run on lm-evaluation-harness tasks",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return ("usage: bertology COMMAND [flags]   (bertology COMMAND --help: its flags; bertology --version)\n\n"
            "commands:\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """Run `bertology COMMAND ...` (`argv` without the program name; default sys.argv[1:]); return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"bertology {__version__}")
        return 0
    command, *rest = argv
    if command not in COMMANDS:
        print(f"bertology: unknown command {command!r}; use one of {', '.join(COMMANDS)} (bertology --help)",
              file=sys.stderr)
        return 2
    # sys.argv, as `python -m bertology.<command>` would see it: the absl commands read it with the
    # program name first, the argparse ones (convert, tokenizer, analyze) without.
    sys.argv = [f"bertology {command}", *rest]
    return importlib.import_module(f"bertology.{command}").main()


if __name__ == "__main__":
    from bertology.cli import end_process

    end_process(main())
