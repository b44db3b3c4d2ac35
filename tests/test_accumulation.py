"""Exact gradient accumulation for every objective: k microbatches give the whole batch's gradient
(within 1e-6, relative to the gradient where it exceeds 1: ELECTRA's 50x discriminator weight;
float32, dropout off) however unevenly the batch's weight falls on them, and with
no accumulation every loss and metric is the formula the objectives used before they returned
undivided means (numpy, from the model's outputs)."""

import functools
import re

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import log_softmax

from bertology import models, objectives
from bertology.models.transformer import TransformerConfig
from bertology.models.tasks import TaskModel
from bertology.families.electra.objective import replace_with_samples
from bertology.train import optimizer as optimizer_lib
from bertology.train.step import make_train_step, state_init
from bertology.train.step import accumulated_gradients

VOCAB, B, L, P, CHOICES = 40, 8, 16, 4, 3
# Microbatch i of k takes rows i, i+k, ...: with k=4 they hold 8, 0, 8 and 1 predictions and 32,
# 10, 32 and 11 real tokens: their weights are uneven, and one has no prediction at all.
LENGTHS = np.array([16, 5, 16, 6, 16, 5, 16, 5])
PREDICTIONS = np.array([4, 0, 4, 1, 4, 0, 4, 0])
PRETRAINING = ["bert", "roberta", "albert", "spanbert", "electra", "electra_15", "replace_mlm", "all_tokens_mlm"]
FINETUNING = ["classification", "regression", "token", "qa", "choice"]
ROWS = np.arange(B)[:, None]


def pretraining_batch(rng):
    mask = (np.arange(L) < LENGTHS[:, None]).astype(np.int32)
    ids = rng.integers(5, VOCAB, (B, L)).astype(np.int32) * mask
    positions = np.tile(np.arange(1, P + 1), (B, 1)).astype(np.int32)
    weights = (np.arange(P) < PREDICTIONS[:, None]).astype(np.float32)
    masked_ids = ids[ROWS, positions]
    ids[ROWS, positions] = np.where(weights > 0, 4, masked_ids)  # [MASK]
    return dict(input_ids=ids, input_mask=mask, segment_ids=((np.arange(L) >= 3) * mask).astype(np.int32),
                masked_positions=positions, masked_ids=masked_ids, masked_weights=weights,
                next_sentence_label=rng.integers(0, 2, B).astype(np.int32), span_start=positions, span_end=positions + 1)


def confident_generator(params):
    """ELECTRA's generator with its output bias 50 ahead on token 7, so it samples 7 whatever the
    Gumbel noise (microbatches draw other noise than the whole batch) and replaces the same tokens."""
    def bump(path, x):
        return x.at[7].add(50.0) if path[0].key == "generator" and x.shape == (VOCAB,) else x

    return jax.tree_util.tree_map_with_path(bump, params)


@functools.cache  # both tests read it; nothing mutates it
def case(name):
    """(model, params, batch, objective) of one objective on a tiny model without dropout."""
    rng = np.random.default_rng(0)
    if name in PRETRAINING:
        family = "electra" if name in ("electra_15", "replace_mlm", "all_tokens_mlm") else name
        c = helpers.config(family, "tiny")
        c.model.update(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                       dropout_rate=0.0, attention_dropout_rate=0.0)
        if "embedding_size" in c.model:
            c.model.embedding_size = 16
        if family == "electra":
            c.model.discriminator_head = "mlm" if name.endswith("_mlm") else "rtd"
        spec = {"name": "electra", "variant": name} if family == "electra" else family
        batch = pretraining_batch(rng)
        model = models.build(c.model)
    else:
        cfg = TransformerConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                            dropout_rate=0.0, attention_dropout_rate=0.0)
        shape = (B, CHOICES, L) if name == "choice" else (B, L)
        mask = (np.arange(L) < np.resize(LENGTHS, shape[:-1])[..., None]).astype(np.int32)
        batch = dict(input_ids=(rng.integers(5, VOCAB, shape) * mask).astype(np.int32), input_mask=mask,
                     segment_ids=np.zeros(shape, np.int32))
        if name == "classification":
            batch["label"] = rng.integers(0, 3, B).astype(np.int32)
        elif name == "choice":
            batch["label"] = rng.integers(0, CHOICES, B).astype(np.int32)
        elif name == "regression":
            batch["label"] = rng.uniform(0, 5, B).astype(np.float32)
        elif name == "qa":
            batch["start_position"] = rng.integers(0, L, B).astype(np.int32)
            batch["end_position"] = rng.integers(0, L, B).astype(np.int32)
        else:  # token: rows 1, 3, 5, 7 (two of the four microbatches) have no labelled word at all
            labelled = (np.arange(L) < np.array([12, 0, 3, 0, 16, 0, 1, 0])[:, None]) & (np.arange(L) % 2 == 0)
            batch["labels"] = np.where(labelled, rng.integers(0, 5, (B, L)), -1).astype(np.int32)
        model = TaskModel(cfg, name, {"classification": 3, "token": 5}.get(name, 1))
        spec = "finetune"
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(1), batch)["params"])
    if name.startswith("electra") or name.endswith("_mlm"):
        params = confident_generator(params)
    return model, params, batch, objectives.get(spec)


@pytest.mark.parametrize("name", PRETRAINING + FINETUNING)
def test_k_microbatches_give_the_whole_batch_gradient(name):
    model, params, batch, objective = case(name)
    key = jax.random.key(3)
    whole = jax.jit(jax.grad(lambda p: objective(p, batch, key, model), has_aux=True))
    grads, metrics = whole(params)
    g, m = jax.jit(accumulated_gradients(model, objective, 4))(params, batch, key)
    for path, a in jax.tree_util.tree_leaves_with_path(grads):
        a, b = np.asarray(a), np.asarray(dict(jax.tree_util.tree_leaves_with_path(g))[path])
        assert np.abs(a - b).max() <= 1e-6 * max(1.0, np.abs(a).max()), jax.tree_util.keystr(path)
    assert set(m) == set(metrics)
    for key_ in metrics:
        np.testing.assert_allclose(m[key_], metrics[key_], rtol=1e-6, atol=1e-7, err_msg=key_)
    assert any(np.abs(np.asarray(x)).max() > 1e-3 for x in jax.tree.leaves(grads))  # a gradient worth comparing


# --- with no accumulation: the formulas of before -------------------------------------------------

def _nll(logits, labels):
    return -np.take_along_axis(log_softmax(logits, -1), labels[..., None], -1)[..., 0]


def _bce(logits, labels):
    return np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))


def _mlm(logits, ids, w, name="mlm"):
    correct = np.take_along_axis(logits, ids[..., None], -1)[..., 0] >= logits.max(-1)
    return {f"{name}_loss": (_nll(logits, ids) * w).sum() / (w.sum() + 1e-5),
            f"{name}_accuracy": (correct * w).sum() / (w.sum() + 1e-5)}


def _pair(logits, labels, name):
    return {f"{name}_loss": _nll(logits, labels).mean(), f"{name}_accuracy": (logits.argmax(-1) == labels).mean()}


def _ce(logits, labels, w):
    safe = np.maximum(labels, 0)
    return ((_nll(logits, safe) * w).sum() / max(w.sum(), 1.0),
            ((logits.argmax(-1) == safe) * w).sum() / max(w.sum(), 1.0))


def formula_before(name, model, params, batch):
    """The loss and metrics as the objectives computed them before (float64, evaluation mode)."""
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    ids, w = batch.get("masked_ids"), batch.get("masked_weights")
    if name in ("bert", "roberta", "albert", "spanbert"):
        out = jax.tree.map(f64, model.apply({"params": params}, batch))
        m = _mlm(out["mlm_logits"], ids, w)
        if name == "bert":
            m.update(_pair(out["nsp_logits"], batch["next_sentence_label"], "nsp"))
        if name == "albert":
            m.update(_pair(out["sop_logits"], batch["next_sentence_label"], "sop"))
        if name == "spanbert":
            m.update(_mlm(out["sbo_logits"], ids, w, "sbo"))
        return {"loss": sum(v for k, v in m.items() if k.endswith("_loss")), **m}
    if name in PRETRAINING:  # ELECTRA: the generator's sample with evaluation's fixed key
        gen = model.apply({"params": params}, batch, method="generate")
        corrupted, original, replaced = replace_with_samples(batch, gen, jax.random.split(jax.random.key(0), 3)[0])
        corrupted_batch, replaced = {**batch, "input_ids": corrupted}, np.asarray(replaced)
        m = _mlm(f64(gen), ids, w)
        if name in ("electra", "electra_15"):
            disc = f64(model.apply({"params": params}, corrupted_batch, method="discriminate"))
            dw = batch["input_mask"].astype(np.float64)
            if name == "electra_15":
                dw = np.zeros((B, L))
                dw[ROWS, batch["masked_positions"]] = w
            d = dw.sum() + 1e-5
            m.update(disc_loss=(_bce(disc, replaced) * dw).sum() / d, disc_accuracy=(((disc > 0) == replaced) * dw).sum() / d,
                     replaced_fraction=(replaced * dw).sum() / d)
        else:
            positions, targets, tw = batch["masked_positions"], ids, w
            if name == "all_tokens_mlm":
                positions, targets, tw = np.tile(np.arange(L), (B, 1)), np.asarray(original), batch["input_mask"]
            disc = f64(model.apply({"params": params}, corrupted_batch, positions=positions, method="discriminate"))
            m.update(_mlm(disc, targets, tw, "disc"))
            m["replaced_fraction"] = (replaced * batch["input_mask"]).sum() / batch["input_mask"].sum()
        return {"loss": m["mlm_loss"] + 50 * m["disc_loss"], **m}
    out = jax.tree.map(f64, model.apply({"params": params}, batch))
    if name == "regression":
        return {"loss": np.mean((out["logits"] - batch["label"]) ** 2)}
    if name == "qa":
        (s, sa), (e, ea) = (_ce(out[f"{x}_logits"], batch[f"{x}_position"], np.ones(B)) for x in ("start", "end"))
        return {"loss": (s + e) / 2, "accuracy": (sa + ea) / 2}
    if name == "token":
        loss, acc = _ce(out["logits"], batch["labels"], batch["labels"] >= 0)
    else:
        loss, acc = _ce(out["logits"], batch["label"], np.ones(B))
    return {"loss": loss, "accuracy": acc}


@pytest.mark.parametrize("name", PRETRAINING + FINETUNING)
def test_one_batch_gives_the_formulas_of_before(name):
    model, params, batch, objective = case(name)
    loss, metrics = objective(params, batch, None, model)
    before = formula_before(name, model, params, batch)
    np.testing.assert_allclose(loss, before["loss"], rtol=1e-6)
    for k, v in before.items():
        np.testing.assert_allclose(metrics[k], v, rtol=1e-6, atol=1e-7, err_msg=k)


def test_accumulation_reads_the_weights_without_running_the_model():
    """The pass that reads the whole batch's weights is dropped by XLA: a step with k=2 compiles
    to as many matrix products as a step with k=1 (the model once, in the microbatch loop)."""
    model, _, batch, objective = case("bert")
    tx, lr = optimizer_lib.make(helpers.config("bert", "tiny").optimizer, 10)
    init = state_init(model, tx, {k: v[:1] for k, v in batch.items()})
    state = jax.eval_shape(lambda k: nn.meta.unbox(init(k)), jax.random.key(0))

    def dots(k):
        step = jax.jit(make_train_step(model, objective, tx, lr, k))
        return len(re.findall(r" dot\(", step.lower(state, batch, jax.random.key(0)).compile().as_text()))

    assert dots(1) > 10
    assert dots(2) == dots(1)


def test_means_add_across_batches_and_keep_their_denominator():
    a = objectives.Mean.of(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 0.0, 1.0]), eps=1e-5)
    b = objectives.Mean.of(jnp.array([5.0]), jnp.array([2.0]), eps=1e-5)
    both = jax.tree.map(jnp.add, a, b)
    assert both.eps == 1e-5  # a constant of the mean, added once, not once per batch
    np.testing.assert_allclose(both.value(), (1 + 3 + 10) / (4 + 1e-5), rtol=1e-7)
    np.testing.assert_allclose(a.value(jnp.float32(4.0)), 4 / (4 + 1e-5), rtol=1e-7)  # the whole batch's weight
    empty = objectives.Mean.of(jnp.zeros(3), jnp.zeros(3))
    assert float(empty.value()) == 0.0 and float(jax.grad(lambda x: objectives.Mean.of(x, jnp.zeros(3)).value())(jnp.ones(3)).sum()) == 0.0
