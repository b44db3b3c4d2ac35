"""The Colab notebooks run top to bottom on CPU (shortened by environment variables), so they cannot rot."""

import ast
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
def test_quickstart_notebook_runs_and_the_analysis_notebook_reads_its_runs(tmp_path):

    from bertology.analysis import similarity

    nb = execute("quickstart", tmp_path, steps=30)
    text = "".join(output_text(c) for c in nb.cells if c.cell_type == "code")
    first, last = map(float, re.search(r"MLM loss ([\d.]+) -> ([\d.]+)", text).groups())
    assert last < first - 0.5, text  # 30 steps take tiny BERT well below its initial ln(vocab)
    assert (tmp_path / "colab_finetune_pretrained" / "results.json").exists()
    assert (tmp_path / "colab_finetune_scratch" / "results.json").exists()

    # the analysis notebook, on the quickstart's runs (it trains its own only where there are none)
    nb = execute("analysis", tmp_path, steps=30)
    code = [c for c in nb.cells if c.cell_type == "code"]
    text = "".join(output_text(c) for c in code)
    assert f"analysing {tmp_path / 'colab_quickstart'}" in text and not (tmp_path / "colab_analysis").exists()
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 7, "similarity, head statistics, one sentence's maps, probe, curves, two surfaces"
    # what it prints is what the library computes for the run
    sentences = ast.literal_eval(re.search(r"broke = (\[.*?\])", "".join(c.source for c in code), re.S).group(1))
    fresh = similarity.self_similarity(tmp_path / "colab_quickstart", sentences, "broke")
    printed = [float(x) for x in re.findall(r"self-similarity (-?[\d.]+)", text)]
    assert printed == pytest.approx([row["self_similarity"] for row in fresh["layers"]], abs=1e-4)
    accuracies = [float(x) for x in re.findall(r"probe accuracy ([\d.]+)", text)]
    assert len(accuracies) == len(fresh["layers"]) and all(0 <= a <= 1 for a in accuracies)


@pytest.mark.slow
def test_converted_checkpoint_notebook_reproduces_minilm(tmp_path):
    nb = execute("load_converted_checkpoint", tmp_path, steps=1)
    text = output_text(nb.cells[-2])
    # (the cell's output also holds transformers 5's weight-loading progress bar, "[00:00<?, ?it/s]")
    cosines = [float(x) for x in re.search(r"cosine with sentence-transformers: \[([^\]]*)\]", text).group(1).split()]
    assert len(cosines) == 3 and min(cosines) > 0.9999



@pytest.mark.slow
def test_sweep_notebook_trains_each_masking_unit_and_plots_them(tmp_path):
    nb = execute("sweep", tmp_path, steps=3)
    code = [c for c in nb.cells if c.cell_type == "code"]
    (result,) = [o for o in code[1].outputs if o.output_type == "execute_result"]  # the cell's value, not its log
    final = ast.literal_eval(result.data["text/plain"])
    assert sorted(final) == ["entity", "span", "token", "whole_word"]
    assert all([step for step, _ in points] == [1, 2, 3] for points in final.values())
    # each unit masks differently, so its held-out batches and their losses differ
    assert len({points[-1][1] for points in final.values()}) == 4, final
    assert any("image/png" in o.get("data", {}) for o in code[2].outputs)
