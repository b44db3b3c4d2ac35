"""Bad input ends the CLI with one clear line, a non-zero status and no traceback."""

import subprocess
import sys

import pytest
from helpers import REPO


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
