"""Carried state across batches (train/step.py, train/run.py, data/lanes.py) with a toy objective
whose carry is each lane's running sum of token ids: the lanes continue one token stream, the
carry after k steps equals a numpy running sum reset at each pass, and it is the same with
gradient accumulation, across a checkpoint resume and on 8 simulated devices."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bertology.data import lanes
from bertology.data.transforms import Transform
from bertology.errors import UserError
from bertology.objectives import Mean, Objective, Terms
from bertology.train import run as run_lib
from bertology.train import sharding

V, B, L = 12, 8, 4


class Tokens(Transform):
    """A contiguous toy transform: every document's ids in order, 0 between documents."""

    contiguous = True

    def __init__(self):
        super().__init__(ml_collections.ConfigDict(), None)

    def instances(self, documents, rng, lanes_):
        stream = np.concatenate([np.concatenate([*doc, [0]]) for doc in documents]).astype(np.int32)
        return lanes.cut({"input_ids": stream, "position": np.arange(len(stream), dtype=np.int32)}, lanes_, L, rng)


class Toy(nn.Module):
    """A per-token value w[id]: the objective adds the carried sum to it, so losses see the carry."""

    @nn.compact
    def __call__(self, batch, deterministic=True):
        w = self.param("w", nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab",)), (V,))
        return w[batch["input_ids"]]


def running_sum(params, batch, rng, model):
    before = batch["carry"]["sum"]
    pred = model.apply({"params": params}, batch) + 0.01 * before[:, None]
    err = (pred - (batch["input_ids"] % 3)) ** 2
    carry = {"sum": before + batch["input_ids"].sum(-1).astype(jnp.float32)}
    return Terms(loss={"mse": 1.0}, means={"mse": Mean.of(err)}, carry=carry)


TOY = Objective(running_sum)


def documents(n_tokens=3 * B * L + 7):
    rng = np.random.default_rng(5)
    ids = rng.integers(1, V, n_tokens)
    return [[ids[i:i + 9][:5], ids[i:i + 9][5:]] for i in range(0, n_tokens, 9)]


def config(mesh=(1, 1), accum=1, **overrides):
    c = ml_collections.ConfigDict(dict(seed=0, mesh=sharding.mesh_config("dp", mesh), batch_size=B,
                                       grad_accum_steps=accum, log_every=1, eval_every=0, checkpoint_every=1000,
                                       keep_checkpoints=3))
    c.update(overrides)
    return c


def stream():
    return lanes.LanesStream(Tokens(), documents(), batch_size=B, seed=0)


def fit(workdir, steps, **overrides):
    data = stream()
    first = next(data)
    data.set_state({"pass": 0, "offset": 0, "step": 0})
    with run_lib.setup(ml_collections.FrozenConfigDict(config(**overrides)), workdir, model=Toy(), objective=TOY,
                       example={"input_ids": first["input_ids"][:1]},
                       optimizer=lambda _: (optax.sgd(0.05), optax.constant_schedule(0.05)),
                       carry={"sum": np.zeros(B, np.float32)}) as run:
        out = run.fit(data, steps)
        carry = np.asarray(jax.device_get(run.state["carry"]["sum"]))
    return [h["loss"] for h in out["history"]], carry


def test_lanes_continue_one_stream_and_each_pass_cuts_it_elsewhere():
    doc = documents()
    tokens = np.concatenate([np.concatenate([*d, [0]]) for d in doc])
    data = stream()
    batches = [next(data) for _ in range(6)]
    passes = [batches[:3], batches[3:]]  # 3 * B * L + 7 tokens make 3 steps of B lanes of L
    for p in passes:
        assert [int(b["carry_reset"][0]) for b in p] == [1, 0, 0] and all((b["carry_reset"] == b["carry_reset"][0]).all() for b in p)
        lane = np.concatenate([b["position"] for b in p], axis=1)  # [B, 3L] stream positions
        np.testing.assert_array_equal(np.diff(lane, axis=1), 1)  # row b of step t+1 continues row b of step t
        np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in p], axis=1), tokens[lane])
        assert len(np.unique(lane)) == lane.size
    starts = []
    for p in range(6):
        data.set_state({"pass": p, "offset": 0, "step": 0})
        starts.append(int(next(data)["position"][0, 0]))
    assert len(set(starts)) > 1 and max(starts) < L  # passes start at other offsets: other cuts
    data.set_state({"pass": 1, "offset": 1, "step": 4})
    np.testing.assert_array_equal(next(data)["input_ids"], batches[4]["input_ids"])


def test_carry_is_the_running_sum_of_each_lane(tmp_path):
    steps = 5  # one pass of 3 steps, then 2 of the next: the reset zeroes every lane
    _, carry = fit(tmp_path, steps)
    data = stream()
    batches = [next(data) for _ in range(steps)]
    expected = np.zeros(B)
    for b in batches:
        expected = np.where(b["carry_reset"] == 1, 0, expected) + b["input_ids"].sum(-1)
    np.testing.assert_allclose(carry, expected, rtol=0, atol=0)
    assert (carry != sum(b["input_ids"].sum(-1) for b in batches)).all()  # the reset did happen


def test_accumulation_and_eight_devices_match_one_microbatch_on_one(tmp_path):
    losses, carry = fit(tmp_path / "one", 7)
    for name, overrides in {"accum": dict(accum=4), "eight": dict(mesh=(8, 1)), "both": dict(mesh=(8, 1), accum=2)}.items():
        l, c = fit(tmp_path / name, 7, **overrides)
        np.testing.assert_allclose(l, losses, rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(c, carry, err_msg=name)


def test_resume_continues_the_carry_exactly(tmp_path):
    losses, carry = fit(tmp_path / "whole", 8)
    first, _ = fit(tmp_path / "split", 4, checkpoint_every=2)
    second, resumed = fit(tmp_path / "split", 8, checkpoint_every=2)
    assert first + second == losses
    np.testing.assert_array_equal(resumed, carry)


def test_evaluation_carries_across_its_batches_from_zero(tmp_path):
    data = stream()
    batches = [{k: v for k, v in next(data).items() if k != "carry_reset"} for _ in range(3)]
    with run_lib.setup(ml_collections.FrozenConfigDict(config()), tmp_path, model=Toy(), objective=TOY, example={"input_ids": batches[0]["input_ids"][:1]},
                       optimizer=lambda _: (optax.sgd(0.05), optax.constant_schedule(0.05)),
                       carry={"sum": np.full(B, 7.0, np.float32)}) as run:
        params = run.state["params"]
        got = run.evaluator(batches)(params)
    w = np.asarray(params["w"], np.float64)
    total, before = 0.0, np.zeros(B)
    for b in batches:
        total += ((w[b["input_ids"]] + 0.01 * before[:, None] - b["input_ids"] % 3) ** 2).sum()
        before = before + b["input_ids"].sum(-1)
    np.testing.assert_allclose(got["mse"], total / (3 * B * L), rtol=1e-5)


def test_a_corpus_too_small_for_the_lanes_is_refused():
    with pytest.raises(UserError, match="too few for 8 lanes"):
        Tokens().instances(documents(20), np.random.default_rng(0), B)
