"""The Colab notebooks run top to bottom on CPU (shortened by environment variables), so they cannot rot."""

import os
import pathlib
import re

import nbformat
import pytest
from helpers import REPO
from nbclient import NotebookClient


def execute(name: str, tmp_path: pathlib.Path, steps: int) -> nbformat.NotebookNode:
    nb = nbformat.read(REPO / "colab" / f"{name}.ipynb", as_version=4)
    os.environ.update(BERTOLOGY_RUNS=str(tmp_path), BERTOLOGY_NOTEBOOK_STEPS=str(steps), HF_HUB_OFFLINE="1")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO / "colab")}}).execute()
    return nb


def output_text(cell) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)


@pytest.mark.slow
@pytest.mark.optimized
def test_quickstart_notebook_runs(tmp_path):
    nb = execute("quickstart", tmp_path, steps=30)
    text = "".join(output_text(c) for c in nb.cells if c.cell_type == "code")
    first, last = map(float, re.search(r"MLM loss ([\d.]+) -> ([\d.]+)", text).groups())
    assert last < first - 0.5, text  # 30 steps take tiny BERT well below its initial ln(vocab)
    assert (tmp_path / "colab_finetune_pretrained" / "results.json").exists()
    assert (tmp_path / "colab_finetune_scratch" / "results.json").exists()


@pytest.mark.slow
def test_converted_checkpoint_notebook_reproduces_minilm(tmp_path):
    nb = execute("load_converted_checkpoint", tmp_path, steps=1)
    text = output_text(nb.cells[-2])
    # (the cell's output also holds transformers 5's weight-loading progress bar, "[00:00<?, ?it/s]")
    cosines = [float(x) for x in re.search(r"cosine with sentence-transformers: \[([^\]]*)\]", text).group(1).split()]
    assert len(cosines) == 3 and min(cosines) > 0.9999
