"""Smaller models while fine-tuning: Q8BERT quantization (quantizer and straight-through gradient,
moving-average ranges, int8 inference equal to the fake-quantized model), magnitude and head
pruning (Zhu & Gupta's schedule, sparsity reached, pruned weights stay 0, Michel's importance),
and TinyBERT's prediction-layer distillation from a fine-tuned teacher."""

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import tiny

from bertology import models
from bertology.errors import UserError
from bertology.models import layout
from bertology.models.tasks import TaskModel
from bertology.train import prune as prune_lib
from bertology.train import quantize as qz
from bertology.train.checkpoint import load_params
from bertology.train.finetune import finetune

V, L = 40, 10
SIZES = {"num_layers": 2, "vocab_size": V, "hidden_size": 16, "num_heads": 4, "intermediate_size": 32,
         "max_position_embeddings": L, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
CFG = models.encoder_config({"family": "bert", **SIZES})
STACK = layout.stack_layer_index


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] < np.array([L, 6, 3, 8])[:, None]).astype(np.int32)
    return dict(input_ids=np.where(mask > 0, rng.integers(1, V, (4, L)), 0).astype(np.int32), input_mask=mask,
                segment_ids=np.zeros((4, L), np.int32))


def _init(model, seed=0):
    return nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), _batch())["params"])


# --- Q8BERT ------------------------------------------------------------------------------------------

def test_quantizer_is_symmetric_max_abs_with_a_straight_through_gradient():
    x = jnp.array([-2.0, -0.013, 0.0, 0.5, 1.0])
    s = qz.scale_of(jnp.max(jnp.abs(x)))
    assert float(s) == pytest.approx(127 / 2)
    np.testing.assert_array_equal(qz.quantize(x, s), np.clip(np.round(np.asarray(x) * 63.5), -127, 127))
    np.testing.assert_array_equal(qz.quantize(jnp.array([3.0]), s), [127.0])  # beyond the range: clamped
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(qz.fake_int(v, s) / s))(x), np.ones(5))
    # the range's "gradient" is what the batch saw: its max |x|
    assert float(jax.grad(lambda r: qz.observe(x, r))(jnp.float32(0.7))) == pytest.approx(2.0)


def test_ranges_follow_their_moving_average_and_are_never_trained():
    params = {"dense": {"kernel": jnp.ones((2, 2)), qz.RANGE: jnp.float32(0.0)}}
    tx = qz.ema_ranges(optax.sgd(0.1), decay=0.9)
    state = tx.init(params)
    for seen, want in ((5.0, 5.0), (7.0, 0.9 * 5.0 + 0.1 * 7.0)):
        grads = {"dense": {"kernel": jnp.full((2, 2), 0.5), qz.RANGE: jnp.float32(seen)}}
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        assert float(params["dense"][qz.RANGE]) == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(params["dense"]["kernel"], 1 - 2 * 0.1 * 0.5)


@pytest.mark.slow
def test_fake_quantized_model_is_near_float_and_int8_inference_equals_it():
    model = qz.QuantizedTaskModel(CFG, "classification", 3)
    params = _init(model)
    assert params["encoder"]["attention_0"]["query"][qz.RANGE] == 0  # a range beside every kernel
    batch = _batch()
    # ranges as training leaves them: the moving averages of the max |x| the model saw
    grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, batch)["logits"].sum()))(params)
    params = jax.tree.map(lambda p, g, r: g if r else p, params, grads, qz.is_range(params))

    def logits(net, p):  # jitted: op by op these forward passes took most of the test's half minute
        return np.asarray(jax.jit(lambda q: net.apply({"params": q}, batch)["logits"])(p))

    fake = logits(model, params)
    plain = logits(TaskModel(CFG, "classification", 3), params)
    assert np.abs(fake - plain).max() < 0.05 * np.abs(plain).max()  # 8 bits lose a little ...
    assert np.abs(fake - plain).max() > 0  # ... and something

    int8 = qz.int8_params(params)
    kernel = int8["encoder"]["ffn_0"]["intermediate"]["kernel"]
    assert kernel.dtype == jnp.int8 and int(jnp.abs(kernel.astype(jnp.int32)).max()) == 127
    assert int8["encoder"]["embeddings"]["token"]["embedding"].dtype == jnp.int8
    got = logits(qz.QuantizedTaskModel(CFG, "classification", 3, int8=True), int8)
    np.testing.assert_allclose(got, fake, rtol=1e-5, atol=1e-6)
    # a quarter of the bytes for every table and kernel, plus one float32 scale each
    tables = [w for path, w in jax.tree_util.tree_leaves_with_path(params) if path[-1].key in ("kernel", "embedding")]
    assert qz.nbytes(int8) == qz.nbytes(params) - sum(3 * w.size for w in tables) + 4 * len(tables)


def test_quantization_aware_finetuning_learns_and_writes_int8_weights(tmp_path):
    result = finetune(tiny("sst2", "glue/SST-2", quantize="int8", total_steps=40), tmp_path)
    loss = np.array(result["train_loss"])
    assert loss[-5:].mean() < loss[:5].mean() - 0.15, loss
    ranges = [v for v, r in zip(jax.tree.leaves(result["params"]), jax.tree.leaves(qz.is_range(result["params"]))) if r]
    assert len(ranges) == 2 * (4 + 2) + 2 and min(float(r) for r in ranges) > 0  # Q,K,V,O,FFN x2 per layer; pooler, head
    assert result["int8_bytes"] < 0.35 * result["float32_bytes"]
    template = qz.int8_params(jax.device_get(result["params"]))
    saved = flax.serialization.msgpack_restore((tmp_path / "int8_params.msgpack").read_bytes())
    assert jax.tree.structure(saved) == jax.tree.structure(template)
    with pytest.raises(UserError, match="set grad_accum_steps=1"):
        finetune(tiny("sst2", "glue/SST-2", quantize="int8", grad_accum_steps=2), tmp_path / "accum")


# --- pruning -------------------------------------------------------------------------------------------

def test_cubic_schedule_is_zhu_and_gupta():
    plan = prune_lib.Plan(kind="magnitude", sparsity=0.9, begin=10, end=30)
    for t in (0, 10, 15, 20, 30, 40):
        frac = min(max((t - 10) / 20, 0), 1)
        assert float(prune_lib.cubic_sparsity(t, plan)) == pytest.approx(0.9 * (1 - (1 - frac) ** 3), abs=1e-6)


@pytest.mark.parametrize("scope", ["global", "per_matrix"])
def test_magnitude_pruning_reaches_its_sparsity_and_pruned_weights_stay_zero(scope):
    model = TaskModel(CFG, "classification", 3)
    params = _init(model)
    plan = prune_lib.Plan(kind="magnitude", sparsity=0.75, scope=scope, begin=2, end=10, every=2)
    tx = prune_lib.pruned(optax.sgd(0.05), plan, STACK)
    state = tx.init(params)
    where = prune_lib.prunable(params, STACK)
    loss = jax.jit(jax.grad(lambda p, b: model.apply({"params": p}, b)["logits"].std()))
    zero_before = None
    for step in range(1, 16):
        updates, state = tx.update(loss(params, _batch(step)), state, params)
        params = optax.apply_updates(params, updates)
        got = prune_lib.sparsity(params, STACK)
        assert got == pytest.approx(float(prune_lib.cubic_sparsity(step - step % 2, plan)), abs=2e-3)
        zero = [np.asarray(w) == 0 for w, p in zip(jax.tree.leaves(params), jax.tree.leaves(where)) if p]
        if zero_before is not None:  # once pruned, always 0 (the optimizer keeps proposing updates)
            assert all(np.all(z[b]) for z, b in zip(zero, zero_before))
        zero_before = zero
    assert prune_lib.sparsity(params, STACK) == pytest.approx(0.75, abs=2e-3)
    if scope == "per_matrix":
        for w, p in zip(jax.tree.leaves(params), jax.tree.leaves(where)):
            if p:
                assert np.mean(np.asarray(w) == 0) == pytest.approx(0.75, abs=1 / w.size + 1e-9)
    assert np.all(np.asarray(params["encoder"]["embeddings"]["token"]["embedding"]) != 0)  # not prunable


def test_head_importance_is_the_gate_gradient():
    """Σ W_o[h]·∂L/∂W_o[h] equals ∂L/∂ξ_h for a gate ξ_h scaling head h's output (Michel et al.)."""
    model = TaskModel(CFG, "classification", 3)
    params, batch = _init(model), _batch()

    def loss(p):
        return jnp.sum(model.apply({"params": p}, batch)["logits"] ** 2)

    def gated(xi):
        p = jax.tree.map(lambda x: x, params)
        out = p["encoder"]["attention_1"]["output"]
        p["encoder"]["attention_1"]["output"] = {**out, "kernel": out["kernel"] * xi[:, None, None]}
        return loss(p)

    want = jax.grad(gated)(jnp.ones(4))
    g = jax.grad(loss)(params)["encoder"]["attention_1"]["output"]["kernel"]
    got = jnp.sum(params["encoder"]["attention_1"]["output"]["kernel"] * g, axis=(1, 2))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_head_pruning_removes_the_least_important_heads():
    model = TaskModel(CFG, "classification", 3)
    params = _init(model)
    plan = prune_lib.Plan(kind="heads", sparsity=0.5, begin=1, end=4, every=1)
    tx = prune_lib.pruned(optax.sgd(0.05), plan, STACK)
    state = tx.init(params)
    grad = jax.jit(jax.grad(lambda p, b: jnp.sum(model.apply({"params": p}, b)["logits"] ** 2)))
    for step in range(1, 8):
        updates, state = tx.update(grad(params, _batch(step)), state, params)
        params = optax.apply_updates(params, updates)
    assert sum(prune_lib.heads_left(params, STACK)) == 4  # half of 2 x 4
    kept = np.asarray(state.heads)
    for i in range(2):
        attn = params["encoder"][f"attention_{i}"]
        gone = kept[i] == 0
        assert np.all(np.asarray(attn["query"]["kernel"])[:, gone] == 0) and np.all(np.asarray(attn["value"]["bias"])[gone] == 0)
        assert np.all(np.asarray(attn["output"]["kernel"])[~gone] != 0)


def test_pruned_finetuning_reaches_its_sparsity(tmp_path):
    result = finetune(tiny("sst2", "glue/SST-2", total_steps=30, **{"prune.kind": "magnitude", "prune.sparsity": 0.9,
                                                                    "prune.every": 5}), tmp_path)
    assert result["sparsity"] == pytest.approx(0.9, abs=1e-3)
    params, _ = load_params(tmp_path)
    assert prune_lib.sparsity(params, STACK) == pytest.approx(0.9, abs=1e-3)
    with pytest.raises(UserError, match="prune.kind='lottery' is not one of"):
        finetune(tiny("sst2", "glue/SST-2", **{"prune.kind": "lottery"}), tmp_path / "bad")


# --- every stack layout: the family's layer_index, not a parameter-name pattern ----------------------------

LAYOUTS = {
    "unscanned": {"family": "bert", **SIZES},
    "scanned": {"family": "bert", **SIZES, "scan_layers": True},
    "mobilebert": {"family": "mobilebert", **SIZES, "embedding_size": 8, "intra_bottleneck_size": 8,
                   "num_feedforward_networks": 2},
}


def _on_layout(name):
    """A classifier on the `name` trunk layout, and that family's layer_index."""
    block = LAYOUTS[name]
    family = models.family(block["family"])
    return TaskModel(family.trunk_config(block), "classification", 3, "full", block["family"]), family.layer_index


def _layer_kernels(params, name):
    """The layer kernels, found from the tree by each layout's own naming (not through layer_index)."""
    top = {"scanned": lambda k: k == "layers", "mobilebert": lambda k: k.startswith("layer_"),
           "unscanned": lambda k: k.split("_")[0] in ("attention", "ffn")}[name]
    return [w for path, w in jax.tree_util.tree_leaves_with_path(params)
            if path[0].key == "encoder" and top(path[1].key) and path[-1].key == "kernel"]


@pytest.mark.parametrize("scope", ["global", "per_matrix"])
@pytest.mark.parametrize("name", ["scanned", "mobilebert"])
def test_magnitude_pruning_reaches_its_sparsity_on_every_stack_layout(name, scope):
    """A scanned stack (`layers`, layer = leading axis) and MobileBERT's `layer_{i}` modules are
    pruned like the unscanned stack: every layer kernel is prunable, the run reaches the sparsity,
    and per_matrix prunes each layer's slice of a scanned kernel to it (once: nothing was pruned
    there, and `sparsity` divided by zero)."""
    model, index = _on_layout(name)
    params = _init(model)
    where = prune_lib.prunable(params, index)
    kernels = _layer_kernels(params, name)
    assert sum(w.size for w, p in zip(jax.tree.leaves(params), jax.tree.leaves(where)) if p) == sum(w.size for w in kernels)
    plan = prune_lib.Plan(kind="magnitude", sparsity=0.5, scope=scope, begin=1, end=3, every=1)
    tx = prune_lib.pruned(optax.sgd(0.05), plan, index)
    state = tx.init(params)
    loss, update = jax.jit(jax.grad(lambda p, b: model.apply({"params": p}, b)["logits"].std())), jax.jit(tx.update)
    for step in range(1, 5):
        updates, state = update(loss(params, _batch(step)), state, params)
        params = optax.apply_updates(params, updates)
    assert prune_lib.sparsity(params, index) == pytest.approx(0.5, abs=2e-3)
    kernels = _layer_kernels(params, name)
    zeros = sum(int(np.sum(np.asarray(w) == 0)) for w in kernels)
    assert zeros / sum(w.size for w in kernels) == pytest.approx(0.5, abs=2e-3)
    if scope == "per_matrix":
        for w in kernels:
            for matrix in (np.asarray(w) if name == "scanned" else np.asarray(w)[None]):
                assert np.mean(matrix == 0) == pytest.approx(0.5, abs=1 / matrix.size + 1e-9)


def test_head_pruning_reaches_mobilebert_layers_and_refuses_a_scanned_stack():
    model, index = _on_layout("mobilebert")
    params = _init(model)
    plan = prune_lib.Plan(kind="heads", sparsity=0.5, begin=1, end=4, every=1)
    tx = prune_lib.pruned(optax.sgd(0.05), plan, index)
    state = tx.init(params)
    assert state.heads.shape == (2, 4)
    grad = jax.jit(jax.grad(lambda p, b: jnp.sum(model.apply({"params": p}, b)["logits"] ** 2)))
    for step in range(1, 6):
        updates, state = tx.update(grad(params, _batch(step)), state, params)
        params = optax.apply_updates(params, updates)
    assert sum(prune_lib.heads_left(params, index)) == 4
    for i in range(2):
        gone = np.asarray(state.heads)[i] == 0
        out = np.asarray(params["encoder"][f"layer_{i}"]["attention"]["output"]["kernel"])
        assert np.all(out[gone] == 0) and np.all(out[~gone] != 0)
    model, index = _on_layout("scanned")
    with pytest.raises(UserError, match="scan_layers=False"):
        prune_lib.pruned(optax.sgd(0.05), plan, index).init(_init(model))


# --- TinyBERT's prediction layer -------------------------------------------------------------------------

def test_prediction_layer_distillation_from_a_finetuned_teacher(tmp_path):
    finetune(tiny("sst2", "glue/SST-2", total_steps=30), tmp_path / "teacher")
    before, _ = load_params(tmp_path / "teacher")
    student = tiny("sst2", "glue/SST-2", total_steps=30, teacher_checkpoint=str(tmp_path / "teacher"),
                   **{"model.num_layers": 1, "model.hidden_size": 16})
    result = finetune(student, tmp_path / "student")
    loss = np.array(result["train_loss"])
    assert loss[-5:].mean() < loss[:5].mean(), loss
    after, _ = load_params(tmp_path / "teacher")
    assert jax.tree.all(jax.tree.map(np.array_equal, before, after))
    with pytest.raises(UserError, match="not on the classification task 'stsb'"):
        finetune(tiny("stsb", "glue/STS-B", teacher_checkpoint=str(tmp_path / "teacher")), tmp_path / "bad")
