"""Multi-task fine-tuning (MT-DNN) and projected attention layers (PALs).

Two small synthetic tasks of different kinds, written here: `sst2` (a sentence's topic, files or
numbers) and `conll2003` (tag the words that name a queue-like thing B-LOC). One multi-task run
of them (module-scoped) serves the learning, evaluation, continuation and resume tests.
"""

import dataclasses
import json
import shutil
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY

from bertology import models, tasks, validation
from bertology.data.rows import ShuffledRows
from bertology.errors import UserError
from bertology.models import pals as pals_lib
from bertology.models.tasks import TASK, Head, MultiTaskModel, task_of, with_task
from bertology.models.transformer import Mask, TransformerConfig
from bertology.train import finetune as finetune_lib
from bertology.train import multitask
from bertology.train.checkpoint import load_params
from bertology.train.finetune import finetune

TOPICS = (("file", "open", "read", "path", "directory", "write", "close"),
          ("number", "integer", "float", "value", "sum", "zero", "int"))
THINGS, FILLER = ("socket", "thread", "queue", "buffer"), ("the", "a", "is", "of", "and", "in", "to", "with")
STEPS, EVERY = 60, 20


def write_tasks(root):
    """An SST-2-layout topic task (64 training rows, a test file to submit) and a CoNLL-layout
    tagging task (48 sentences)."""
    rng = np.random.default_rng(0)
    (root / "sst2").mkdir()
    for split, n in (("train", 64), ("dev", 32)):
        labels = np.arange(n) % 2
        lines = [" ".join(rng.choice(TOPICS[y], rng.integers(3, 7))) + f"\t{y}" for y in labels]
        (root / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    (root / "sst2" / "test.tsv").write_text("index\tsentence\n0\tread the file path\n1\tsum the integer value\n")
    (root / "conll").mkdir()
    for name, n in (("eng.train", 48), ("eng.testa", 24)):
        sentences = []
        for _ in range(n):
            words = list(rng.choice(FILLER, rng.integers(3, 6)))
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(THINGS)))
            sentences.append("\n".join(f"{w} X X {'B-LOC' if w in THINGS else 'O'}" for w in words))
        (root / "conll" / name).write_text("\n\n".join(sentences) + "\n")


def config(root, **overrides):
    c = multitask.default_config(("sst2", "conll2003"))
    c.model.update(TINY, num_layers=1, dropout_rate=0.0, attention_dropout_rate=0.0)
    c.task_data.sst2.dir, c.task_data.conll2003.dir = str(root / "sst2"), str(root / "conll")
    c.data.max_seq_length = 16
    c.batch_size = c.eval_batch_size = 8
    c.update(total_steps=STEPS, eval_every=EVERY, checkpoint_every=EVERY, keep_checkpoints=5, log_every=1)
    c.optimizer.learning_rate = 3e-3
    c.mesh.shape = (1, 1)
    c.update_from_flattened_dict(overrides)
    return c


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(data root, workdir, results) of an uninterrupted 60-step run on both tasks."""
    root = tmp_path_factory.mktemp("multitask")
    write_tasks(root)
    return root, root / "run", finetune(config(root), root / "run")


def steps_of(workdir):
    """{step: the task it trained} from metrics.jsonl (the task names its metrics)."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: next(k.split("/")[0] for k in r if k.endswith("/cross_entropy")) for r in rows if "loss" in r}


def test_draws_follow_the_sizes_or_the_mixture_and_are_a_function_of_the_step():
    rows = lambda: {"a": ShuffledRows({"input_ids": np.zeros((300, 1), np.int32)}, 4, 0),  # noqa: E731
                    "b": ShuffledRows({"input_ids": np.ones((100, 1), np.int32)}, 4, 0)}
    steps = 4000
    for weights, share_a in (((300, 100), 0.75), ((1, 3), 0.25), ((1, 0), 1.0)):
        mixture = multitask.TaskMixture(rows(), lambda s, w=weights: multitask.probabilities(w, "proportional", s, steps, 1), 0)
        batches = [next(mixture) for _ in range(steps)]
        names = [task_of(b) for b in batches]
        for name, b in zip(names, batches):  # one task per batch, its rows only
            assert [k for k in b if k.startswith(TASK)] == [TASK + name]
            assert set(b["input_ids"].ravel()) == {0 if name == "a" else 1}
        assert abs(names.count("a") / steps - share_a) < 0.025, (weights, names.count("a") / steps)
    resumed = multitask.TaskMixture(rows(), lambda s: multitask.probabilities((1, 0), "proportional", s, steps, 1), 0)
    twin = multitask.TaskMixture(rows(), lambda s: multitask.probabilities((1, 1), "proportional", s, steps, 1), 0)
    for _ in range(50):
        next(twin)
    state = twin.get_state()
    again = multitask.TaskMixture(rows(), twin.chances, 0)
    again.set_state(json.loads(json.dumps(state)))  # as a checkpoint keeps it
    for _ in range(50):
        a, b = next(twin), next(again)
        assert a.keys() == b.keys() and np.array_equal(a["input_ids"], b["input_ids"])
    assert twin.task_at(7) == again.task_at(7) and resumed.task_at(7) == "a"
    # annealed (Stickland & Murray): alpha from 1 in the first epoch to 0.2 in the last
    np.testing.assert_allclose(multitask.probabilities((300, 100), "annealed", 0, 100, 5), [0.75, 0.25])
    np.testing.assert_allclose(multitask.probabilities((300, 100), "annealed", 99, 100, 5),
                               np.array([300, 100]) ** 0.2 / (300 ** 0.2 + 100 ** 0.2))


CFG = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                        max_position_embeddings=8, dropout_rate=0.0, attention_dropout_rate=0.0)
ONE_LAYER = dataclasses.replace(CFG, num_layers=1)  # what the compiled checks run: half the program to compile
HEADS = (Head("a", "classification", 3), Head("b", "token", 4))
PALS = pals_lib.PALSettings(8, 2, True)


def tiny_batches():
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(1, 50, (4, 8)).astype(np.int32), "input_mask": np.ones((4, 8), np.int32),
             "segment_ids": np.zeros((4, 8), np.int32)}
    return {"a": with_task({**batch, "label": np.array([0, 1, 2, 1])}, "a"),
            "b": with_task({**batch, "labels": rng.integers(0, 4, (4, 8))}, "b")}


def shapes(model, batch):
    return nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch)["params"]))


@pytest.fixture(scope="module")
def with_pals():
    """A one-layer encoder with heads a (classification) and b (token), each task with PALs, and
    parameters drawn with numpy (N(0, 0.2), norms' scales 1): an initialisation compiled for this
    alone took 10 CPU-s."""
    model, batches = MultiTaskModel(ONE_LAYER, HEADS, pals=PALS), tiny_batches()
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: np.ones(x.shape, x.dtype) if path[-1].key == "scale" else
        rng.normal(0, 0.2, x.shape).astype(x.dtype), shapes(model, batches["a"]))
    return model, batches, params


def test_each_step_trains_the_shared_trunk_and_only_its_own_head_and_pals(with_pals):
    model, batches, params = with_pals
    assert params["head_a"]["kernel"].shape == (16, 3) and params["head_b"]["kernel"].shape == (16, 4)
    grad = jax.grad(lambda p, name: multitask.OBJECTIVE(p, batches[name], None, model)[0])
    grads = jax.jit(lambda p: {name: grad(p, name) for name in batches})(params)
    for name, other in (("a", "b"), ("b", "a")):
        for part in ("head", "pals"):
            assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads[name][f"{part}_{other}"]))
            assert all(float(jnp.abs(g).max()) > 0.0 for g in jax.tree.leaves(grads[name][f"{part}_{name}"]))
        moved = [float(jnp.abs(g).max()) > 0.0 for g in jax.tree.leaves(grads[name]["encoder"])]
        assert sum(moved) > 0.9 * len(moved)  # every trunk tensor the task reads


def test_a_pal_with_zero_up_projection_is_the_plain_model(with_pals):
    model, batches, params = with_pals
    plain = MultiTaskModel(ONE_LAYER, HEADS)
    own = {k: v for k, v in params.items() if not k.startswith("pals_")}  # the same trunk and heads, no PALs
    silent = {**params, "pals_a": {**params["pals_a"], "up": jax.tree.map(jnp.zeros_like, params["pals_a"]["up"])}}
    loud = {**params, "pals_a": {**params["pals_a"], "up": jax.tree.map(lambda x: x + 0.5, params["pals_a"]["up"])}}
    out = jax.jit(lambda: [m.apply({"params": p}, batches["a"])["logits"]
                           for m, p in ((plain, own), (model, silent), (model, loud))])()
    # the same function, as compiled with the branch's zeros in it (XLA fuses the two programs differently: ~1e-8
    # apart), where PALs with BERT's initialisation move the logits by ~1e-6 and these by far more
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=1e-7 * float(jnp.abs(out[0]).max()))
    assert float(jnp.abs(out[2] - out[0]).max()) > 0.1 * float(jnp.abs(out[0]).max())


def test_a_tiny_run_learns_both_tasks(run):
    _, workdir, result = run
    evals = {e["step"]: e for e in result["evals"]}
    assert sorted(evals) == [20, 40, 60]
    first, last = evals[20], evals[60]
    assert last["sst2/accuracy"] >= 90 and last["sst2/accuracy"] > first["sst2/accuracy"], result["evals"]
    assert last["conll2003/f1"] >= 90 and last["conll2003/f1"] > first["conll2003/f1"], result["evals"]
    scores = result["scores"]
    assert scores["average"] == pytest.approx((scores["sst2/accuracy"] + scores["conll2003/f1"]) / 2)
    saved = json.loads((workdir / "results.json").read_text())
    assert saved["task"] == "sst2+conll2003" and saved["kind"] == "multitask" and saved["primary"] == "average"
    assert saved["tasks"]["conll2003"] == {"kind": "token", "primary": "f1", "training_rows": 48}
    drawn = steps_of(workdir)
    assert sorted(drawn) == list(range(1, STEPS + 1)) and set(drawn.values()) == {"sst2", "conll2003"}
    assert (workdir / "tensorboard").is_dir() and "| multi-task, a head per task |" in (workdir / "parameters.md").read_text()
    # each task's leaderboard files in its own directory: the topic of each test sentence
    assert (workdir / "sst2" / "submission" / "SST-2.tsv").read_text() == "index\tprediction\n0\t0\n1\t1\n"


def test_each_head_alone_scores_what_the_run_reported(run):
    """A single-task run from the multi-task checkpoint (MT-DNN's continued fine-tuning) starts from
    its trunk and the task's head: a plain single-task model that scores what the multi-task run
    reported for the task. (The run itself is the single-task driver's; a compiled step of it would
    cost this file another 10 CPU-s.)"""
    root, workdir, result = run
    params, _ = load_params(workdir)
    for name, directory in (("conll2003", "conll"), ("sst2", "sst2")):
        c = finetune_lib.default_config(name)
        c.update(init_checkpoint=str(workdir), batch_size=8, eval_batch_size=8)
        c.data.update(dir=str(root / directory), max_seq_length=16)
        c.mesh.shape = (1, 1)
        job = finetune_lib.encoder_job(c, tasks.get(name))
        start = job.start_params(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes(job.model, job.example)))
        np.testing.assert_array_equal(start["head"]["kernel"], params[f"head_{name}"]["kernel"])
        scores = job.evaluator(types.SimpleNamespace(shard=lambda b: b))(start)["scores"]
        assert scores == {k.split("/")[1]: v for k, v in result["scores"].items() if k.startswith(name + "/")}


def test_a_killed_run_resumes_to_the_same_tasks_and_parameters(run, tmp_path):
    """The workdir as a kill after the step-20 checkpoint leaves it; the rerun draws the same tasks
    at steps 21..60 and ends with the same parameters, bit for bit."""
    root, workdir, result = run
    work = tmp_path / "killed"
    shutil.copytree(workdir, work)
    for step in (40, 60):
        shutil.rmtree(work / "checkpoints" / str(step))
    (work / "results.json").unlink()
    resumed = finetune(config(root), work)
    assert [h for h in json.loads((work / "results.json").read_text())["evals"]] == result["evals"]
    assert steps_of(work) == steps_of(workdir)
    rows = multitask.TaskMixture({n: None for n in ("sst2", "conll2003")},
                                 lambda s: multitask.probabilities((64, 48), "proportional", s, STEPS, 3), 0)
    assert [rows.task_at(s) for s in range(STEPS)] == [steps_of(workdir)[s + 1] for s in range(STEPS)]
    straight, _ = load_params(workdir)
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(jax.device_get(resumed["params"]))):
        np.testing.assert_array_equal(a, b)


def test_pal_parameters_follow_the_formula_and_the_comparison_counts_each_way(with_pals):
    _, batches, params = with_pals
    for settings in (PALS, pals_lib.PALSettings(8, 2, False)):  # two layers: shared projections count once
        tree = shapes(MultiTaskModel(CFG, HEADS, pals=settings), batches["a"])
        for name in ("a", "b"):
            n = sum(x.size for x in jax.tree.leaves(tree[f"pals_{name}"]))
            per_layer = 1 if settings.shared_projections else 2
            assert n == pals_lib.parameters(settings, 16, 2) == (2 * 16 * 8 + 16 + 8) * per_layer + 2 * 3 * (64 + 8)
    paper = pals_lib.PALSettings(204, 12, True)
    one_layer = jax.eval_shape(lambda: pals_lib.ProjectedAttention(TransformerConfig(), paper).init(
        jax.random.key(0), 11, jnp.zeros((1, 4, 768)), Mask(keys=jnp.ones((1, 4), bool)), True))
    assert sum(x.size for x in jax.tree.leaves(one_layer)) == 2 * 768 * 204 + 768 + 204 + 3 * (204 * 204 + 204)
    assert pals_lib.parameters(paper, 768, 12) == 1_819_836  # the paper's PALs on BERT-base, per task
    trunk = finetune_lib.Trunk(ONE_LAYER, "bert", models.family("bert"), None, {}, None)
    examples = {n: {k: v[:1] for k, v in b.items() if not k.startswith(TASK) and "label" not in k}
                for n, b in batches.items()}
    counts = multitask.parameter_counts(trunk, HEADS, examples, 4, PALS)
    heads = 16 * 3 + 3 + 16 * 4 + 4
    encoder = counts["encoder"]
    adapters = 2 * (2 * 16 * 4 + 4 + 16)  # after attention and FFN: down and up with biases
    norms = 2 * 16 + 2 * 2 * 16  # the embeddings' and each sublayer's LayerNorm (scale, bias), trained per task
    assert counts == {"encoder": encoder, "full fine-tuning, a model per task": 2 * encoder + heads,
                      "adapters (4), a set per task": encoder - norms + 2 * (adapters + norms) + heads,
                      "multi-task, a head per task": encoder + heads,
                      "multi-task + PALs (8, 2 heads)": encoder + heads + 2 * pals_lib.parameters(PALS, 16, 1)}
    assert sum(x.size for x in jax.tree.leaves(params)) == counts["multi-task + PALs (8, 2 heads)"]


@pytest.mark.parametrize("overrides, message", [
    ({"tasks": ("sst2", "sst2")}, "tasks=('sst2', 'sst2') names 'sst2' twice; name each task once"),
    ({"tasks": ("sst2", "nli")}, "tasks=('sst2', 'nli') names 'nli', which is no task; list encoder tasks"),
    ({"mixture": (1, -2)}, "mixture=(1, -2) gives conll2003 the weight -2; give each task a number >= 0"),
    ({"mixture": (1,)}, "mixture=(1,) has 1 weights for the 2 tasks ('sst2', 'conll2003'); give one weight per task"),
    ({"sampling": "uniform"}, "sampling='uniform' is not one of ('proportional', 'sqrt', 'annealed')"),
    ({"pals.size": 10, "pals.heads": 4}, "pals.heads=4 does not divide pals.size=10"),
    ({"head_dropout.sst2": 1.5}, "head_dropout.sst2=1.5 is not a dropout probability in [0, 1)"),
])
def test_bad_multitask_settings_are_one_line(tmp_path, overrides, message):
    c = config(tmp_path, **overrides)
    with pytest.raises(UserError) as e:
        validation.check(c)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("overrides, message", [
    ({"quantize": "int8"}, "quantize='int8' is an option of single-task fine-tuning"),
    ({"pals.size": 8, "pals.heads": 2, "mode": "features"}, "pals.size=8 with mode='features'"),
])
def test_options_a_multitask_run_cannot_take_are_refused(tmp_path, overrides, message):
    with pytest.raises(UserError, match=f"^{message}"):
        finetune(config(tmp_path, **overrides), tmp_path / "run")
