"""Fine-tuning: every head learns on fixture data, the modes train what they should, LLRD is ELECTRA's."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES, REPO, short_run_config, sst2_from, tiny

from bertology import finetune as finetune_cli
from bertology import models, tasks
from bertology.data.rows import ShuffledRows
from bertology.errors import UserError
from bertology.evaluation import outputs
from bertology.models import layout
from bertology.models.tasks import TaskModel
from bertology.models.transformer import stack_layers
from bertology.train import optimizer as optimizer_lib
from bertology.train.checkpoint import load_params
from bertology.train.finetune import default_config, encoder_job, finetune, merge_pretrained, trainable_mask


def falls(result, drop):
    loss = np.array(result["train_loss"])
    return loss[-5:].mean() < loss[:5].mean() - drop


@pytest.mark.parametrize("task, data_dir, drop", [
    ("sst2", "glue/SST-2", 0.3),
    ("stsb", "glue/STS-B", 2.0),
    ("conll2003", "conll2003", 0.5),
    ("squad_v1", "squad", 0.5),
    ("swag", "swag", 0.3),
])
def test_each_head_learns_fixture_data(tmp_path, task, data_dir, drop):
    result = finetune(tiny(task, data_dir), tmp_path)
    assert falls(result, drop), result["train_loss"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["task"] == task and saved["steps"] == 40 and set(saved["scores"]) >= {result["primary"]}
    if task == "sst2":  # the leaderboard file for the unlabeled test split
        rows = (tmp_path / "submission" / "SST-2.tsv").read_text().splitlines()
        assert rows[0] == "index\tprediction" and [r.split("\t")[0] for r in rows[1:]] == ["0", "1"]
        assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}
    if task == "squad_v1":
        preds = json.loads((tmp_path / "predictions_validation.json").read_text())
        assert set(preds) == {"q1", "q2", "q3", "q4", "q5"}
        context = " ".join(e["context"] for e in tasks.get(task).load(str(FIXTURES / "squad"), None)["validation"])
        assert all(p in context for p in preds.values())  # answers are substrings of the contexts


def test_interrupted_run_resumes_to_the_same_results(tmp_path):
    """SIGTERM mid-run checkpoints and stops; rerunning in the same workdir ends exactly where an
    uninterrupted run does (dropout on, so the resumed run must replay the dropout keys too)."""
    c = tiny("sst2", "glue/SST-2", total_steps=30, eval_every=10)
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.1
    straight = finetune(c, tmp_path / "straight")

    work = tmp_path / "interrupted"
    metrics = work / "metrics.jsonl"

    def preempt_after_five_steps():
        deadline = time.time() + 300
        while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal arriving after the run must not end pytest
    try:
        threading.Thread(target=preempt_after_five_steps, daemon=True).start()
        stopped = finetune(c, work)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped["preempted"] and 5 <= stopped["steps"] < 30, stopped
    assert not (work / "results.json").exists()

    resumed = finetune(c, work)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 31))  # the rerun went on from the checkpoint
    saved = {name: json.loads((d / "results.json").read_text()) for name, d in (("a", tmp_path / "straight"), ("b", work))}
    for r in saved.values():
        del r["seconds"]
    assert saved["a"] == saved["b"] and len(saved["b"]["train_loss"]) == 30 and [e["step"] for e in saved["b"]["evals"]] == [10, 20, 30]
    for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (tmp_path / "straight" / "submission" / "SST-2.tsv").read_text() == (work / "submission" / "SST-2.tsv").read_text()


def test_a_run_from_a_fine_tuning_run_keeps_its_head_on_its_own_task_only(tmp_path):
    """Continued fine-tuning (the second stage of configs/finetune/long_range.py's curriculum): a
    run from a fine-tuning run of the same task starts from its trunk, its head and its scalar mix
    (mode "features"); a run of another task from its trunk under a fresh head and mix (SST-2's two
    outputs would not fit STS-B's one). Each records the model block it built (the first run's),
    so a third stage could start from it."""
    first = finetune(tiny("sst2", "glue/SST-2", total_steps=2, mode="features"), tmp_path / "first")["params"]
    block = load_params(tmp_path / "first")[1]["model"]
    for task, data_dir in (("sst2", "glue/SST-2"), ("stsb", "glue/STS-B")):
        c = tiny(task, data_dir, init_checkpoint=str(tmp_path / "first"), mode="features")
        c.model.num_layers = 5  # a config file's model block, which the checkpoint's replaces
        job = encoder_job(c, tasks.get(task))
        assert job.config.model.to_dict() == block
        fresh = jax.tree.map(lambda x: np.full(x.shape, 7, x.dtype),
                             nn.meta.unbox(jax.eval_shape(lambda: job.model.init(jax.random.key(0), job.example)["params"])))
        start = job.start_params(fresh)
        want = {"encoder": first["encoder"], **{part: (first if task == "sst2" else fresh)[part] for part in ("head", "mix")}}
        assert jax.tree.structure(start) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("n, batch_size", [(5, 8), (13, 4)])
def test_shuffled_rows_cover_each_pass_and_resume_anywhere(n, batch_size):
    rows = ShuffledRows({"i": np.arange(n)}, batch_size, seed=0)
    seq = np.concatenate([next(rows)["i"] for _ in range(12)])
    for p in range(len(seq) // n):  # every pass over the set is a permutation of it, and they differ
        assert sorted(seq[p * n:(p + 1) * n]) == list(range(n))
    assert len({tuple(seq[p * n:(p + 1) * n]) for p in range(len(seq) // n)}) > 1
    for cut in (1, 5, 9):
        resumed = ShuffledRows({"i": np.arange(n)}, batch_size, seed=0)
        resumed.set_state({"position": cut * batch_size})
        np.testing.assert_array_equal(np.concatenate([next(resumed)["i"] for _ in range(12 - cut)]), seq[cut * batch_size:])


def test_layerwise_lr_decay_is_electras():
    params = {
        "encoder": {"embeddings": {"token": {"embedding": jnp.ones(3)}}, "attention_0": {"query": {"kernel": jnp.ones(3)}},
                    "ffn_1": {"output": {"kernel": jnp.ones(3)}}, "pooler": {"kernel": jnp.ones(3)}},
        "head": {"kernel": jnp.ones(3)},
    }
    m = optimizer_lib.layerwise_multipliers(params, num_layers=2, decay=0.5, layer_index=layout.stack_layer_index)
    # decay^(L + 2 - depth): embeddings depth 0, layer i depth i + 1, the rest depth L + 2
    assert m["encoder"]["embeddings"]["token"]["embedding"] == 0.5 ** 4
    assert m["encoder"]["attention_0"]["query"]["kernel"] == 0.5 ** 3
    assert m["encoder"]["ffn_1"]["output"]["kernel"] == 0.5 ** 2
    assert m["encoder"]["pooler"]["kernel"] == m["head"]["kernel"] == 1.0
    # Adam's first step moves every weight by lr·sign(grad); the multiplier scales exactly that
    cfg = default_config("sst2").optimizer
    cfg.update(dict(learning_rate=0.1, warmup_steps=0, weight_decay=0.0, clip_norm=1e9))
    tx, _ = optimizer_lib.make(cfg, 10, multipliers=m)
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    got = jax.tree.map(lambda u: float(u[0]), updates)
    expected = jax.tree.map(lambda x: -0.1 * x, m)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4), got, expected)


def test_layerwise_lr_decay_gives_each_layer_its_rate_on_every_stack_layout():
    """MobileBERT's `layer_{i}` modules and each layer of a scanned stack get their own decayed
    rate (they once all got the full rate): the scanned stack's Adam step equals the unscanned
    one's stacked, and each MobileBERT layer moves by lr · decay^(L + 1 - i)."""
    sizes = dict(num_layers=3, vocab_size=30, hidden_size=16, num_heads=2, intermediate_size=32,
                 max_position_embeddings=8)
    batch = {"input_ids": np.ones((1, 8), np.int32), "input_mask": np.ones((1, 8), np.int32),
             "segment_ids": np.zeros((1, 8), np.int32)}
    cfg = default_config("sst2").optimizer
    cfg.update(dict(learning_rate=0.1, warmup_steps=0, weight_decay=0.0, clip_norm=1e9))

    def first_step(block):
        family = models.family(block["family"])
        model = TaskModel(family.trunk_config(block), "classification", 2, "full", block["family"])
        shapes = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch))["params"])
        params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)  # Adam's first step ignores the values
        m = optimizer_lib.layerwise_multipliers(params, 3, 0.5, family.layer_index)
        tx, _ = optimizer_lib.make(cfg, 10, multipliers=m)
        updates, _ = jax.jit(lambda p: tx.update(jax.tree.map(jnp.ones_like, p), tx.init(p), p))(params)
        return params, updates

    flat, flat_updates = first_step({"family": "bert", **sizes})
    scanned, scanned_updates = first_step({"family": "bert", **sizes, "scan_layers": True})
    assert scanned_updates["encoder"]["layers"]["attention"]["query"]["kernel"].shape[0] == 3
    want = stack_layers({k: v for k, v in flat_updates["encoder"].items()}, 3)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), scanned_updates["encoder"], want)

    _, mobile = first_step({"family": "mobilebert", **sizes, "embedding_size": 8, "intra_bottleneck_size": 8})
    for i in range(3):
        for u in jax.tree.leaves(mobile["encoder"][f"layer_{i}"]):
            np.testing.assert_allclose(np.asarray(u), -0.1 * 0.5 ** (3 + 1 - i), rtol=1e-4)
    for u in jax.tree.leaves(mobile["encoder"]["embeddings"]):
        np.testing.assert_allclose(np.asarray(u), -0.1 * 0.5 ** 5, rtol=1e-4)
    for u in jax.tree.leaves(mobile["head"]):
        np.testing.assert_allclose(np.asarray(u), -0.1, rtol=1e-4)


@pytest.mark.parametrize("mode", ["adapters", "features"])
def test_frozen_modes_keep_the_pretrained_encoder(tmp_path, pretrained, mode):
    c = tiny("sst2", "glue/SST-2", init_checkpoint=str(pretrained), mode=mode, total_steps=30)
    c.optimizer.learning_rate = 1e-2  # only a few parameters move: a higher rate
    result = finetune(c, tmp_path)
    assert falls(result, 0.05), result["train_loss"]
    saved, _ = load_params(pretrained)
    encoder = result["params"]["encoder"]
    for path, leaf in jax.tree_util.tree_leaves_with_path(encoder):
        names = [p.key for p in path]
        if "adapter" in names:
            continue
        before = saved["encoder"]
        for n in names:
            before = before[n]
        if mode == "adapters" and "norm" in names:
            continue  # LayerNorms train with the adapters
        np.testing.assert_array_equal(np.asarray(leaf), before, err_msg=str(names))
    if mode == "adapters":
        up = encoder["attention_0"]["adapter"]["up"]["kernel"]
        assert np.abs(np.asarray(up)).max() > 0  # adapters left their zero init
    else:
        assert not np.allclose(np.asarray(result["params"]["mix"]["weights"]), 0.0)


def test_trainable_mask_by_mode():
    params = {"encoder": {"attention_0": {"query": {"kernel": 0}, "adapter": {"up": {"kernel": 0}}, "norm": {"scale": 0}}},
              "head": {"kernel": 0}, "mix": {"gamma": 0}}
    flat = lambda mode: [m for m in jax.tree.leaves(trainable_mask(params, mode))]  # noqa: E731
    # leaves in key order: adapter.up, norm.scale, query.kernel, head, mix
    assert flat("full") == [True] * 5
    assert flat("adapters") == [True, True, False, True, True]
    assert flat("features") == [False, False, False, True, True]


def test_merge_pretrained_keeps_new_adapters_and_checks_shapes():
    fresh = {"attention_0": {"query": {"kernel": jnp.zeros(2)}, "adapter": {"up": {"kernel": jnp.full(2, 7.0)}}}}
    merged = merge_pretrained(fresh, {"attention_0": {"query": {"kernel": np.ones(2)}}}, "ckpt")
    assert merged["attention_0"]["query"]["kernel"].tolist() == [1, 1]
    assert merged["attention_0"]["adapter"]["up"]["kernel"].tolist() == [7, 7]
    with pytest.raises(UserError, match=r"ckpt: encoder tensor .*query.*kernel.* has shape \(3,\)"):
        merge_pretrained(fresh, {"attention_0": {"query": {"kernel": np.ones(3)}}}, "ckpt")


def test_cli_one_line_errors(tmp_path):
    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "bertology.finetune", *args], capture_output=True, text=True,
                           timeout=300, cwd=REPO)
        return r.returncode, r.stderr.strip()

    assert cli("--config=configs/finetune/glue.py:rte", f"--config.data.dir={tmp_path}", f"--workdir={tmp_path}/o") == (
        2, f"bertology.finetune: error: rte: missing {tmp_path}/train.tsv; put the GLUE RTE files there "
           "(or set --config.data.dir to the RTE directory)")
    assert cli("--summary", str(tmp_path)) == (
        2, f"bertology.finetune: error: {tmp_path}/results.json not found; pass the --workdir of finished fine-tuning runs")


def test_summary_of_runs(tmp_path):
    for name, acc in (("a", 50.0), ("b", 75.5)):
        outputs.write_results(tmp_path / name, {"task": "embedded", "mode": "full", "scores": {"accuracy": acc}})
    assert finetune_cli.summary([str(tmp_path / "a"), str(tmp_path / "b")]).splitlines()[2:] == [
        "| embedded | scratch | full | 50.00 |", "| embedded | scratch | full | 75.50 |"]


@pytest.mark.slow
def test_embedded_task_beats_chance(tmp_path):
    result = finetune(tiny("embedded", total_steps=150, batch_size=32, eval_batch_size=64), tmp_path)
    assert result["scores"]["accuracy"] > 3 * 100 / 8  # 8 balanced classes: chance is 12.5%


@pytest.mark.slow
def test_gpt_fine_tunes_through_its_causal_trunk(tmp_path):
    """A tiny GPT run fine-tunes on the SST-2 fixture through its own trunk (causal, the head at
    each row's last real token), not the bidirectional encoder: the task model's trunk holds the
    pretraining run's decoder tensors and nothing else, and the loss falls."""
    from flax.traverse_util import flatten_dict

    from bertology.families.gpt import model as gpt
    from bertology.train.loop import train

    train(short_run_config("gpt", "tiny", **{"total_steps": 10, "data.max_seq_length": 48}), tmp_path / "pre")
    result = sst2_from(tmp_path / "pre", tmp_path / "ft", steps=30, max_seq_length=48, drop=0.2, lm_weight=0.5)
    assert set(flatten_dict(result["params"]["encoder"])) == set(flatten_dict(gpt.trunk(load_params(tmp_path / "pre")[0])))
    # L = L_task + 0.5 L_LM, step by step (Radford et al. 2018's auxiliary objective)
    rows = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "lm" in r]
    assert len(rows) == 30
    for r in rows:
        assert r["loss"] == pytest.approx(r["cross_entropy"] + 0.5 * r["lm"], rel=1e-5)


def test_language_model_term_is_the_pretraining_models_next_token_loss(tmp_path):
    """The task model's `lm_nll` (GPT's trunk through its tied output layer) is the pretraining
    model's next-token cross-entropy on the same rows; a bidirectional trunk refuses the term."""
    from bertology.objectives import token_nll

    c = helpers.config("gpt", "tiny")
    c.model.update(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64,
                   max_position_embeddings=16, vocab_multiple=8)
    pretraining = models.build(c.model)
    rng = np.random.default_rng(0)
    mask = (np.arange(12)[None] < np.array([12, 7, 3])[:, None]).astype(np.int32)
    batch = {"input_ids": (rng.integers(1, 97, (3, 12)) * mask).astype(np.int32), "input_mask": mask,
             "segment_ids": np.zeros((3, 12), np.int32)}
    params = nn.meta.unbox(pretraining.init(jax.random.key(0), batch)["params"])
    cfg, trunk = models.pretrained_encoder(params, c.model)
    task = TaskModel(cfg, "classification", 2, "full", "gpt")
    fresh = nn.meta.unbox(task.init(jax.random.key(1), batch)["params"])
    out = task.apply({"params": {**fresh, "encoder": trunk}}, batch, language_model=True)
    logits = pretraining.apply({"params": params}, batch)["logits"]
    want = token_nll(logits[:, :-1], batch["input_ids"][:, 1:])[0]
    np.testing.assert_array_equal(out["lm_weights"], mask[:, 1:])
    np.testing.assert_allclose(np.asarray(out["lm_nll"]) * mask[:, 1:], np.asarray(want) * mask[:, 1:], atol=1e-5)
    assert float(np.asarray(want).min()) > 1.0  # a random model: a real loss, not zeros
    bert = TaskModel(cfg, "classification", 2, "full", "bert")
    with pytest.raises(UserError, match="^lm_weight > 0 .* needs a causal trunk, not bert's; set lm_weight=0"):
        bert.init(jax.random.key(1), batch, language_model=True)
    # the fine-tuning run refuses it before anything is traced, in one line
    c = tiny("sst2", "glue/SST-2", lm_weight=0.5)
    with pytest.raises(UserError, match="^lm_weight > 0 .* needs a causal trunk, not bert's; set lm_weight=0$"):
        finetune(c, tmp_path)
