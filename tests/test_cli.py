"""Bad input ends the CLI with one clear line, a non-zero status and no traceback."""

import os
import subprocess
import sys

import pytest
from helpers import REPO

from bertology import cli
from bertology.errors import Diverged, UserError


def run_cli(*args, tmp_path):
    cmd = [sys.executable, "-m", "bertology.pretrain", f"--workdir={tmp_path / 'w'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config=configs/bert.py:tiny", "--config.data.corpus=/nonexistent/corpus.txt"], "corpus not found: /nonexistent/corpus.txt"),
        (["--config=configs/bert.py:tiny", "--config.model.nonsense=3"],
         "unknown config key 'model.nonsense' (--config.model.nonsense); check the spelling"),
        (["--config=configs/bert.py:tiny", "--config.model.share_layer=all"],  # ml_collections adds a suggestion
         "unknown config key 'model.share_layer' (--config.model.share_layer); did you mean \"share_layers\"?"),
        (["--config=configs/bert.py:huge"], "unknown preset 'huge'"),
        (["--config=configs/nope.py:tiny"], "nope.py"),
        (["--config=configs/bert.py:tiny", "--config.model.vocab_size=30522"], "vocab mismatch"),
        # a fused kernel this machine does not have (CI has no GPU): stops before anything is written
        (["--config=configs/bert.py:tiny", "--config.model.attention_backend=cudnn",
          "--config.model.attention_dropout_rate=0"], "model.attention_backend='cudnn' needs an NVIDIA GPU"),
        (["--config=configs/bert.py:tiny", "--config.model.attention_backend=splash"],
         "cannot drop attention probabilities"),
    ],
)
def test_bad_input_one_line(args, expected, tmp_path):
    r = run_cli(*args, tmp_path=tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bertology.pretrain: error:") and expected in lines[0], lines[0]


def test_empty_corpus_one_line(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = run_cli("--config=configs/bert.py:tiny", f"--config.data.corpus={empty}", tmp_path=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"bertology.pretrain: error: corpus {empty} is empty; it needs text, one sentence per line"]


@pytest.mark.parametrize("status", [cli.EXIT_PREEMPTED, 2, cli.EXIT_DIVERGED])
def test_a_run_that_stops_early_ends_without_the_interpreters_teardown(status):
    """`cli.end_process(status)` flushes what was printed and exits at once, without the teardown
    that waits for other threads (and that crashed with signal 11 when a SIGTERM landed while
    XLA's threads were running): a thread still sleeping does not hold the process, which
    `sys.exit` would wait on. A finished run (0) still exits through `sys.exit`."""
    code = ("import threading, time\n"
            "from bertology import cli\n"
            "threading.Thread(target=time.sleep, args=(600,)).start()\n"
            "print('stopped', end='')\n"
            f"cli.end_process({status})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert (r.returncode, r.stdout) == (status, "stopped")
    with pytest.raises(SystemExit) as finished:
        cli.end_process(0)
    assert finished.value.code == 0


@pytest.mark.parametrize("error, status", [(UserError("bad"), 2), (Diverged("training diverged"), 3)])
def test_bad_input_and_divergence_have_their_own_exit_statuses(error, status, capsys):
    """A scheduler or a sweep can tell a diverged run (3: rerunning as is diverges again) from bad
    input (2), a preempted run (143) and a finished one (0)."""

    def main(fv):
        raise error

    assert cli.run("prog", main, argv=["prog", f"--config={REPO}/configs/bert.py:tiny"]) == status
    assert capsys.readouterr().err == f"prog: error: {error}\n"


def test_one_command_runs_every_entry_point(tmp_path):
    """`bertology COMMAND` (python -m bertology): --help lists every command (each a module with a
    `main`), an unknown one stops with one line and status 2, a known one runs its module."""
    import importlib
    import json

    from bertology.__main__ import COMMANDS

    run = lambda *a: subprocess.run([sys.executable, "-m", "bertology", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=300, cwd=REPO)
    shown = run("--help")
    assert shown.returncode == 0 and all(f"  {name}" in shown.stdout for name in COMMANDS)
    assert all(callable(importlib.import_module(f"bertology.{name}").main) for name in COMMANDS)
    wrong = run("pretrian")
    assert wrong.returncode == 2 and wrong.stderr.strip().count("\n") == 0 and "unknown command 'pretrian'" in wrong.stderr
    (tmp_path / "rte").mkdir()
    (tmp_path / "rte" / "results.json").write_text(json.dumps({"task": "rte", "scores": {"accuracy": 66.0}}))
    card = run("grid", "--score_card", str(tmp_path / "rte"))
    assert card.returncode == 0 and "| rte | accuracy 66.0 | 66.0 |" in card.stdout
