"""Seq2seq fine-tuning: the source -> target loaders on few-row copies of the released formats
(JSONL, CNN/DailyMail's CSV and .story files, XSum's JSONL and .summary files), ROUGE and BLEU
against hand-computed values, and tiny BART and T5 fine-tuned on the embedded task for a few
steps: the loss falls and the reported ROUGE is rouge-score's on the written predictions."""

import csv
import hashlib
import json
import pathlib

import flax.linen as nn
import helpers
import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from helpers import sst2_from

from bertology import models, tasks
from bertology.errors import UserError
from bertology.evaluation import generation as metrics
from bertology.models import tasks as model_tasks
from bertology.tasks.seq2seq import parse_story, parse_summary_file
from bertology.train.finetune import finetune

STORY = """(CNN) -- The river rose two metres overnight

Officials closed the old bridge on Monday.

@highlight

River rose two metres overnight

@highlight

The old bridge is closed.
"""
SUMMARY = """[SN]URL[SN]
http://www.bbc.co.uk/news/uk-12345678

[SN]TITLE[SN]
Bridge closed after flood

[SN]FIRST-SENTENCE[SN]
A bridge has been closed after the river rose by two metres.

[SN]RESTBODY[SN]
Officials closed the old bridge on Monday.
Repairs will take a month.
"""


def load(name: str, directory: pathlib.Path, cache: pathlib.Path):
    return tasks.get(name).load(str(directory), str(cache), log=lambda _: None)


def test_rouge_and_bleu_against_hand_computed_values():
    assert metrics.rouge(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(
        dict.fromkeys(metrics.ROUGE_KEYS, 100.0))
    assert metrics.rouge(["dogs bark"], ["the cat sat"])["rouge1"] == 0.0
    # 3 of 3 predicted unigrams match, 3 of 6 reference ones: F1 = 2·1·0.5/1.5; bigrams 2/2 and 2/5
    scores = metrics.rouge(["the cat sat"], ["the cat sat on the mat"])
    assert scores["rouge1"] == pytest.approx(100 * 2 / 3)
    assert scores["rouge2"] == pytest.approx(100 * 2 * 1 * 0.4 / 1.4)
    assert metrics.rouge(["running fast"], ["run fast"])["rouge1"] == 100.0  # the Porter stemmer is on
    assert metrics.bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    with pytest.raises(UserError, match="2 predictions for 1 references"):
        metrics.rouge(["a", "b"], ["a"])


def test_story_and_summary_files_parse_as_released():
    article, highlights = parse_story(STORY)
    assert article == "(CNN) -- The river rose two metres overnight . Officials closed the old bridge on Monday."
    assert highlights == "River rose two metres overnight .\nThe old bridge is closed."
    sections = parse_summary_file(SUMMARY)
    assert sections["FIRST-SENTENCE"] == "A bridge has been closed after the river rose by two metres."
    assert sections["RESTBODY"] == "Officials closed the old bridge on Monday.\nRepairs will take a month."


def test_loaders_read_each_released_format(tmp_path):
    cache = tmp_path / "cache"
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    for split, n in (("train", 3), ("validation", 2)):
        rows = [{"source": f"{split} source {i}", "target": f"{split} target {i}"} for i in range(n)]
        rows.append({"source": "no target"})  # skipped, and counted as such
        (jsonl / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    splits = load("seq2seq_jsonl", jsonl, cache)
    assert [e["target"] for e in splits["validation"]] == ["validation target 0", "validation target 1"]
    assert splits.reads["train"].skipped == {"no source or target": 1} and "test" not in splits

    csv_dir = tmp_path / "cnndm_csv"
    csv_dir.mkdir()
    for split in ("train", "validation", "test"):
        with (csv_dir / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "article", "highlights"])
            writer.writerow(["0a1b", f"An article, with a comma, for {split}.", "First highlight.\nSecond one."])
    splits = load("cnndm", csv_dir, cache)
    assert splits["test"][0]["source"] == "An article, with a comma, for test."
    assert splits["test"][0]["target"] == "First highlight.\nSecond one."

    stories = tmp_path / "cnndm_stories"
    (stories / "cnn" / "stories").mkdir(parents=True)
    (stories / "url_lists").mkdir()
    for split, list_name in (("train", "all_train.txt"), ("val", "all_val.txt"), ("test", "all_test.txt")):
        url = f"http://www.cnn.com/2015/04/01/{split}/index.html"
        (stories / "cnn" / "stories" / f"{hashlib.sha1(url.encode()).hexdigest()}.story").write_text(STORY)
        (stories / "url_lists" / list_name).write_text(url + "\nhttp://www.cnn.com/missing.html\n")
    splits = load("cnndm", stories, cache)
    assert (splits["validation"][0]["source"], splits["validation"][0]["target"]) == parse_story(STORY)
    assert splits.reads["validation"].skipped == {"story file missing": 1}

    xsum = tmp_path / "xsum"
    (xsum / "bbc-summary-data").mkdir(parents=True)
    for i in ("101", "102", "103"):
        (xsum / "bbc-summary-data" / f"{i}.summary").write_text(SUMMARY.replace("Monday", f"day {i}"))
    (xsum / "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json").write_text(
        json.dumps({"train": ["101", "104"], "validation": ["102"], "test": ["103"]}))
    splits = load("xsum", xsum, cache)
    assert splits["validation"][0] == {"idx": 0, "source": "Officials closed the old bridge on day 102.\n"
                                       "Repairs will take a month.", "target": parse_summary_file(SUMMARY)["FIRST-SENTENCE"]}
    assert splits.reads["train"].kept == 1 and splits.reads["train"].skipped == {"summary file missing": 1}

    hf_xsum = tmp_path / "xsum_hf"
    hf_xsum.mkdir()
    for split in ("train", "validation"):
        (hf_xsum / f"{split}.jsonl").write_text(json.dumps({"document": "Doc.", "summary": "Sum.", "id": "1"}) + "\n")
    assert load("xsum", hf_xsum, cache)["train"][0]["target"] == "Sum."
    with pytest.raises(UserError, match="xsum validation split: expected"):
        (hf_xsum / "validation.jsonl").unlink()
        load("xsum", hf_xsum, cache)


def teacher_forced(config, params, examples: list[dict]) -> tuple[float, float]:
    """Held-out perplexity and token accuracy (%) of every example's target, in numpy, in one batch."""
    from bertology.train.finetune import _seq2seq_model, seq2seq_arrays

    model, _, _, tokenizer, _, start = _seq2seq_model(config)
    rows = seq2seq_arrays(examples, tokenizer, config.data.max_seq_length, config.data.max_target_length, start)
    logits = np.asarray(jax.jit(lambda p, r: model.apply({"params": p}, r)["logits"])(params, rows), np.float64)
    top = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    label = np.take_along_axis(logits, rows["targets"][..., None], -1)[..., 0]
    w = rows["target_weights"]
    return float(np.exp(((logz - label) * w).sum() / w.sum())), float(100 * ((label >= top[..., 0]) * w).sum() / w.sum())


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["embedded", "embedded_t5", "embedded_unilm"])
def test_tiny_bart_t5_and_unilm_learn_the_embedded_task(arg, tmp_path):
    config = helpers.config("finetune/seq2seq", arg)
    config.update(total_steps=30, log_every=5, batch_size=16, eval_examples=7, eval_batch_size=4)
    config.mesh.shape = (1, 1)  # what is checked needs no sharding; 8 simulated devices on 2 cores cost compile and run time
    config.generation.max_new_tokens = 12
    results = finetune(config, tmp_path / "run")
    losses = results["train_loss"]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5
    examples = tasks.get("seq2seq_embedded").load(None, log=lambda _: None)["validation"][:7]
    predictions = (tmp_path / "run" / "predictions_validation.txt").read_text().splitlines()
    assert predictions == [p.replace("\n", " ") for p in results["predictions"]["validation"]]
    expected = metrics.score(results["predictions"]["validation"], [e["target"] for e in examples])
    scores = dict(results["scores"])
    if arg != "embedded_unilm":  # encoder-decoders are also scored teacher-forced (7 rows in batches of 4)
        perplexity, accuracy = teacher_forced(config, results["params"], examples)
        assert scores.pop("perplexity") == pytest.approx(perplexity, rel=1e-4)
        assert scores.pop("token_accuracy") == pytest.approx(accuracy, abs=1e-3)
    assert scores == pytest.approx(expected)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["primary"] == "rougeL"


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_an_encoder_decoders_fine_tuning_trunk_is_its_encoder(name):
    """`trunk(params)` of T5 and BART is the encoder (token table included, no pooler): the trunk
    classification, tagging and QA heads sit on takes exactly its tensors, and computes what the
    pretrained model's encoder computes."""
    c = helpers.config(name, "tiny")
    c.model.vocab_size = 90
    model = models.build(c.model)
    rng = np.random.default_rng(0)
    mask = np.array([[1] * 11, [1] * 7 + [0] * 4], np.int32)
    batch = {"input_ids": rng.integers(3, 90, (2, 11)).astype(np.int32) * mask, "input_mask": mask,
             "decoder_input_ids": rng.integers(3, 90, (2, 5)).astype(np.int32),
             "decoder_input_mask": np.ones((2, 5), np.int32)}
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)["params"])
    cfg, trunk = models.pretrained_encoder(params, c.model)
    task = model_tasks.trunk(cfg, name)
    inputs = {k: batch[k] for k in ("input_ids", "input_mask")}
    fresh = nn.meta.unbox(task.init(jax.random.PRNGKey(1), inputs)["params"])
    assert set(flatten_dict(fresh)) == set(flatten_dict(trunk))
    np.testing.assert_array_equal(task.apply({"params": trunk}, inputs)["sequence"],
                                  model.apply({"params": params}, batch, method="encode"))


def test_a_t5_run_fine_tunes_a_classifier_on_its_encoder(tmp_path):
    """A T5 pretraining run feeds classification: its vocabulary is read with the 100 sentinels
    pretraining added (8,100 rows, which a plain load of the sentencepiece model would miss), every
    encoder tensor loads, and the loss falls on the SST-2 fixture."""
    from bertology.train.checkpoint import load_params
    from bertology.train.loop import train

    c = helpers.config("t5", "tiny")
    c.update(batch_size=8, total_steps=2, log_every=1, eval_every=0, checkpoint_every=2)
    c.mesh.shape = (1, 1)
    c.model.update(num_layers=1, hidden_size=32, num_heads=2, head_size=16, intermediate_size=64)
    c.data.update(max_seq_length=32, max_target_length=12)
    train(c, tmp_path / "pre")
    result = sst2_from(tmp_path / "pre", tmp_path / "ft", steps=40, max_seq_length=48, drop=0.3)
    pretrained = flatten_dict(load_params(tmp_path / "pre")[0]["encoder"])
    assert set(flatten_dict(result["params"]["encoder"])) == set(pretrained)
    assert pretrained[("embeddings", "token", "embedding")].shape[0] == 8100


@pytest.mark.slow
def test_a_run_fine_tuned_from_a_checkpoint_records_the_model_it_built_so_it_generates(tmp_path):
    """A seq2seq fine-tuning run's config.json holds the block its model was built from: the
    checkpoint's, vocabulary size included. Before, it held the config file's unused block
    (vocab_size None), and `bertology.generate` on the run stopped with a traceback."""
    from bertology.generation import generate_text
    from bertology.train.checkpoint import load_params
    from bertology.train.loop import train

    pre = helpers.config("bart", "tiny")
    pre.update(total_steps=1, checkpoint_every=1, eval_every=0, batch_size=4)
    pre.mesh.shape = (1, 1)
    train(pre, tmp_path / "pretrained")
    config = helpers.config("finetune/seq2seq", "embedded")
    config.update(init_checkpoint=str(tmp_path / "pretrained"), total_steps=1, batch_size=4, eval_examples=2,
                  eval_batch_size=2)
    config.mesh.shape = (1, 1)
    config.generation.max_new_tokens = 3
    finetune(config, tmp_path / "run")
    recorded, pretrained = (load_params(tmp_path / run)[1]["model"] for run in ("run", "pretrained"))
    assert recorded["vocab_size"] == pretrained["vocab_size"] > 0
    assert {k: v for k, v in recorded.items() if k not in models.RUN_KEYS} == {
        k: v for k, v in pretrained.items() if k not in models.RUN_KEYS}
    assert len(generate_text(tmp_path / "run", ["Return the sum of a and b."], sources=True, max_new_tokens=3)) == 1
