"""The run setup with an objective it was not written for (a causal-LM stand-in): evaluation
weighs batches by what they hold, derived metrics (perplexity) come after aggregation, the log
line and metrics files show the objective's own metrics, and the train state may carry more."""

import json

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
from helpers import BIGRAM_VOCAB as V
from helpers import LM, Bigram, Cycle, bigram_config, lm_batch

from bertology.train import run as run_lib
from bertology.train.step import fresh_state, make_train_step


def nll_np(params, batch):
    logits = np.asarray(params["Embed_0"]["embedding"], np.float64)[batch["input_ids"]]
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]


def test_evaluation_weighs_batches_and_derives_perplexity_after(tmp_path):
    rng = np.random.default_rng(0)
    easy, hard = lm_batch(rng, True, weighted_rows=8), lm_batch(rng, False, weighted_rows=1)
    example = {k: v[:1] for k, v in easy.items()}
    with run_lib.setup(ml_collections.FrozenConfigDict(bigram_config()), tmp_path, model=Bigram(), objective=LM, example=example,
                       optimizer=lambda _: (optax.sgd(0.1), optax.constant_schedule(0.1))) as run:
        confident = {"Embed_0": {"embedding": np.eye(V, dtype=np.float32) * 4.0}}  # predicts its input token
        got = run.evaluator([easy, hard])(confident)
    nll = [nll_np(confident, b) for b in (easy, hard)]
    total = sum((n * b["target_weights"]).sum() for n, b in zip(nll, (easy, hard)))
    weight = sum(b["target_weights"].sum() for b in (easy, hard))
    np.testing.assert_allclose(got["lm_loss"], total / (weight + 1e-5), rtol=1e-6)
    assert got["loss"] == got["lm_loss"]
    np.testing.assert_allclose(got["perplexity"], np.exp(total / (weight + 1e-5)), rtol=1e-6)
    per_batch = [(n * b["target_weights"]).sum() / b["target_weights"].sum() for n, b in zip(nll, (easy, hard))]
    assert abs(np.mean(per_batch) - got["lm_loss"]) > 0.5  # an unweighted mean of batches is far off
    assert abs(np.mean(np.exp(per_batch)) - got["perplexity"]) > 1.0  # and so is a mean of per-batch exps


def test_fit_logs_and_writes_the_objectives_own_metrics(tmp_path, capsys):
    rng = np.random.default_rng(1)
    batches = [lm_batch(rng, False, weighted_rows=w) for w in (8, 3)]
    with run_lib.setup(ml_collections.FrozenConfigDict(bigram_config()), tmp_path, model=Bigram(), objective=LM, example={k: v[:1] for k, v in batches[0].items()},
                       optimizer=lambda _: (optax.sgd(0.1), optax.constant_schedule(0.1))) as run:
        out = run.fit(Cycle(batches), 4, run.evaluator(batches))
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("step ")]
    assert len(lines) == 4 and all("| lm_loss " in l and "| perplexity " in l and "| lr 1.00e-01 |" in l for l in lines)
    assert not any("mlm" in l for l in lines)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4] and [h["loss"] for h in out["history"]] == [r["loss"] for r in train]
    for r in train:  # the step's perplexity is of its two microbatches' joint mean, not of each
        np.testing.assert_allclose(r["perplexity"], np.exp(r["lm_loss"]), rtol=1e-6)
    evals = [r for r in rows if "eval_perplexity" in r]
    assert [r["step"] for r in evals] == [2, 4]
    np.testing.assert_allclose(evals[-1]["eval_perplexity"], np.exp(evals[-1]["eval_lm_loss"]), rtol=1e-6)


def test_the_step_keeps_state_entries_it_does_not_own():
    """Room for a frozen teacher or carried memory: entries beyond step/params/opt_state pass through."""
    model, rng = Bigram(), np.random.default_rng(2)
    batch = lm_batch(rng, False, weighted_rows=8)
    params = nn.meta.unbox(model.init(jax.random.key(0), batch)["params"])
    tx = optax.sgd(0.1)
    teacher = jax.tree.map(lambda x: x * 2, params)
    state = {**fresh_state(params, tx), "teacher": teacher}
    new, _ = jax.jit(make_train_step(model, LM, tx, optax.constant_schedule(0.1), 2))(state, batch, jax.random.key(0))
    assert int(new["step"]) == 1
    assert not np.allclose(new["params"]["Embed_0"]["embedding"], params["Embed_0"]["embedding"])
    jax.tree.map(np.testing.assert_array_equal, new["teacher"], teacher)


def test_metrics_rows_of_a_resumed_run_replace_the_steps_it_redid(tmp_path):
    from bertology.train.metrics import MetricsWriter

    first = MetricsWriter(tmp_path)
    for s in (1, 2, 3):  # a run that checkpointed at step 1 and died after logging step 3
        first.write(s, {"loss": 10.0 + s})
    first.close()
    second = MetricsWriter(tmp_path)  # its rerun, resumed from step 1
    for s in (2, 3):
        second.write(s, {"loss": 20.0 + s})
    second.write(3, {"accuracy": 0.5}, prefix="eval_")
    steps = second.steps()
    second.close()
    assert list(steps) == [1, 2, 3]
    assert [row["loss"] for row in steps.values()] == [11.0, 22.0, 23.0] and steps[3]["eval_accuracy"] == 0.5


def test_timed_checkpoints_come_on_top_of_the_step_cadence(tmp_path):
    """checkpoint_every_minutes: a save whenever that much wall-clock time has passed since the
    last (here a few microseconds: every step); 0 leaves only the step cadence (and the last step)."""
    rng = np.random.default_rng(2)
    batches = [lm_batch(rng, False, weighted_rows=8)]
    for minutes, expected in ((1e-7, [1, 2, 3, 4]), (0, [4])):
        workdir = tmp_path / str(minutes)
        config = bigram_config(checkpoint_every_minutes=minutes, keep_checkpoints=10, eval_every=0)
        with run_lib.setup(ml_collections.FrozenConfigDict(config), workdir, model=Bigram(), objective=LM,
                           example={k: v[:1] for k, v in batches[0].items()},
                           optimizer=lambda _: (optax.sgd(0.1), optax.constant_schedule(0.1))) as run:
            run.fit(Cycle(batches), 4)
        assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == expected
