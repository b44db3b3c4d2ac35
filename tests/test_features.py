"""Feature extraction: pooling, layer choice, padding independence, context, and the CLI."""

import subprocess
import sys

import helpers
import numpy as np
import pytest
from helpers import REPO, tiny, write_run

from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.features import extract


def test_sentence_vector_is_the_masked_mean(pretrained):
    out = extract(pretrained, ["the river bank", "a much longer sentence about the money bank"], max_seq_length=16)
    mask = out["input_mask"].astype(bool)
    for i in range(2):
        np.testing.assert_allclose(out["sentence"][i], out["tokens"][i][mask[i]].mean(0), rtol=1e-5, atol=1e-6)
        assert not out["tokens"][i][~mask[i]].any()  # padding positions are zero


def test_layers_padding_and_context(pretrained):
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


def test_cli(pretrained, tmp_path):
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


@pytest.mark.parametrize("family", ["bert", "mobilebert", "xlnet", "gpt"])
def test_features_are_the_fine_tuning_trunks_layers(family, tmp_path):
    """A tiny random run of each family: every layer `extract` gives is the layer of the trunk the
    task model builds (the family's `task_trunk` for MobileBERT, XLNet and GPT, the shared Encoder
    for BERT), read from the TaskModel itself, zero at padding. The sentence vector is the mean
    over real tokens, except for GPT's causal trunk: its last real token."""
    import flax.linen as nn
    import jax

    from bertology import models
    from bertology.data.tokenizers import for_data
    from bertology.models.tasks import TaskModel
    from bertology.train.checkpoint import load_params

    config = helpers.config(family, "tiny")
    config.model.vocab_size = for_data(config.data).vocab_size
    texts = ["the cat sat on the mat .", "a much longer sentence about modules and their functions ."]
    out = extract(write_run(tmp_path / "run", config, helpers.random_params(config)), texts, layers=(0,), max_seq_length=16)
    batch = {k: out[k] for k in ("input_ids", "input_mask")}
    batch["segment_ids"] = np.zeros_like(batch["input_ids"])
    params, run = load_params(tmp_path / "run")
    cfg, trunk = models.pretrained_encoder(params, run["model"])
    task = TaskModel(cfg, "token", 2, "full", family)
    fresh = nn.meta.unbox(task.init(jax.random.key(1), batch)["params"])
    _, state = task.apply({"params": {**fresh, "encoder": {**fresh["encoder"], **trunk}}}, batch,
                          capture_intermediates=lambda m, _: m.name == "encoder", mutable=["intermediates"])
    want = state["intermediates"]["encoder"]["__call__"][0]["layers"]
    mask = batch["input_mask"][..., None]
    np.testing.assert_allclose(out["tokens"], np.asarray(want[0]) * mask, atol=1e-5, rtol=0)
    for i in range(1, len(want)):
        got = extract(tmp_path / "run", texts, layers=(i,), max_seq_length=16)["tokens"]
        np.testing.assert_allclose(got, np.asarray(want[i]) * mask, atol=1e-5, rtol=0, err_msg=f"layer {i}")
    assert np.abs(out["tokens"][0] - out["tokens"][1]).max() > 1e-2
    lengths = batch["input_mask"].sum(1)
    want_sentence = (out["tokens"][np.arange(2), lengths - 1] if family == "gpt"
                     else out["tokens"].sum(1) / lengths[:, None])
    np.testing.assert_allclose(out["sentence"], want_sentence, atol=1e-5, rtol=0)


def test_rows_longer_than_the_position_table_are_refused_in_one_line(pretrained, tmp_path):
    """Features and fine-tuning refuse rows past the pretrained trunk's 64 learned positions (one
    rule, `tasks.check_length`), rather than read clamped positions."""
    from bertology.train.finetune import finetune

    with pytest.raises(UserError, match="^max_seq_length=65 exceeds the trunk's 64 positions; lower it$"):
        extract(pretrained, ["open file"], max_seq_length=65)
    extract(pretrained, ["open file"], max_seq_length=64)
    # the config's own model block would allow 80 (validation passes): the checkpoint's table refuses
    c = tiny("sst2", "glue/SST-2", init_checkpoint=str(pretrained),
             **{"data.max_seq_length": 80, "model.max_position_embeddings": 128})
    with pytest.raises(UserError, match="^data.max_seq_length=80 exceeds the trunk's 64 positions; lower it$"):
        finetune(c, tmp_path)
