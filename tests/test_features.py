"""Feature extraction: pooling, layer choice, padding independence, context, and the CLI."""

import subprocess
import sys

import numpy as np
import pytest

from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.features import extract
from test_finetune import REPO, pretrained  # noqa: F401 (the module-scoped pretraining fixture)


def test_sentence_vector_is_the_masked_mean(pretrained):  # noqa: F811
    out = extract(pretrained, ["the river bank", "a much longer sentence about the money bank"], max_seq_length=16)
    mask = out["input_mask"].astype(bool)
    for i in range(2):
        np.testing.assert_allclose(out["sentence"][i], out["tokens"][i][mask[i]].mean(0), rtol=1e-5, atol=1e-6)
        assert not out["tokens"][i][~mask[i]].any()  # padding positions are zero


def test_layers_padding_and_context(pretrained):  # noqa: F811
    texts = ["open file", "read file"]
    tokenizer = load_tokenizer(REPO / "src/bertology/data/assets/wordpiece_uncased_8k.txt")
    assert [len(tokenizer.encode(t)) for t in texts] == [2, 2]  # "file" sits at position 2 in both
    last, first = extract(pretrained, texts, max_seq_length=8), extract(pretrained, texts, layers=[0], max_seq_length=8)
    both = extract(pretrained, texts, layers=[0, -1], max_seq_length=8)
    np.testing.assert_allclose(both["tokens"], (first["tokens"] + last["tokens"]) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first["tokens"][0, 2], first["tokens"][1, 2], rtol=1e-6)  # embeddings: no context
    assert not np.allclose(last["tokens"][0, 2], last["tokens"][1, 2], atol=1e-4)  # last layer: contextual
    alone = extract(pretrained, texts[:1], max_seq_length=8, batch_size=1)
    np.testing.assert_allclose(alone["sentence"][0], last["sentence"][0], rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="out of range"):
        extract(pretrained, texts, layers=[7], max_seq_length=8)


def test_cli(pretrained, tmp_path):  # noqa: F811
    (tmp_path / "in.txt").write_text("the river bank\n\nmoney\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "bertology.features", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=300, cwd=REPO)
    r = run(f"--checkpoint={pretrained}", f"--input={tmp_path / 'in.txt'}", f"--out={tmp_path / 'f.npz'}",
            "--max_seq_length=8")
    assert r.returncode == 0, r.stderr
    saved = np.load(tmp_path / "f.npz")
    assert saved["sentence"].shape == (2, 32) and saved["tokens"].shape == (2, 8, 32)
    r = run(f"--checkpoint={pretrained}", "--input=/nonexistent.txt")
    assert r.returncode == 2
    assert r.stderr.strip() == "bertology.features: error: input file not found: /nonexistent.txt; give a text file with one sentence per line"
