"""ULMFiT's fine-tuning recipe (Howard & Ruder 2018): the slanted triangular learning rate as the
paper writes it, gradual unfreezing (top group first, one more group per stage, on flat and
scanned stacks alike), and a fine-tuning run that freezes what it should when it should."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny

from bertology.errors import UserError
from bertology.models import layout
from bertology.models.transformer import stack_layers
from bertology.train import optimizer as optimizer_lib
from bertology.train.finetune import default_config, finetune


def test_slanted_triangular_rate_is_the_papers_formula():
    total, cut_frac, ratio, peak = 100, 0.1, 32, 0.01
    cfg = default_config("sst2").optimizer
    cfg.update(dict(learning_rate=peak, warmup_steps=int(total * cut_frac), schedule="slanted_triangular", stlr_ratio=ratio))
    lr = optimizer_lib.schedule(cfg, total)
    cut = int(np.floor(total * cut_frac))
    for t in range(total + 1):  # eq. 3: p = t/cut, then 1 - (t - cut) / (cut (1/cut_frac - 1))
        p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
        np.testing.assert_allclose(float(lr(t)), peak * (1 + p * (ratio - 1)) / ratio, rtol=1e-5)


def _updates(params, every, steps):
    """Adam's updates of `steps` steps with gradients of ones (ELECTRA's ranks of `params`)."""
    cfg = default_config("sst2").optimizer
    cfg.update(dict(learning_rate=0.1, warmup_steps=0, weight_decay=0.01, clip_norm=1e9))
    ranks = optimizer_lib.unfreezing_ranks(params, 2, layout.stack_layer_index)
    tx, _ = optimizer_lib.make(cfg, 100, unfreezing=(ranks, every))
    state, out = tx.init(params), []
    for _ in range(steps):
        updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
        out.append(updates)
    return ranks, out


def test_gradual_unfreezing_trains_one_more_group_per_stage_top_down():
    params = {"encoder": {"embeddings": {"token": {"embedding": jnp.ones(3)}}, "attention_0": {"query": {"kernel": jnp.ones(3)}},
                          "ffn_1": {"output": {"kernel": jnp.ones(3)}}, "pooler": {"kernel": jnp.ones(3)}},
              "head": {"kernel": jnp.ones(3)}}
    ranks, steps = _updates(params, every=2, steps=8)
    # top down: head and pooler, layer 1, layer 0, embeddings
    assert ranks == {"encoder": {"embeddings": {"token": {"embedding": 3}}, "attention_0": {"query": {"kernel": 2}},
                                 "ffn_1": {"output": {"kernel": 1}}, "pooler": {"kernel": 0}}, "head": {"kernel": 0}}
    for step, updates in enumerate(steps):
        for moving, rank in zip(jax.tree.leaves(updates), jax.tree.leaves(ranks)):
            # a frozen group gets exactly zero (no weight decay either); an unfrozen one Adam's step
            assert (np.abs(np.asarray(moving)) > 0.05).all() if rank <= step // 2 else (np.asarray(moving) == 0).all()


def test_gradual_unfreezing_of_a_scanned_stack_is_the_flat_stacks_stacked():
    layer = {"query": {"kernel": jnp.ones((2, 2))}}
    flat = {"encoder": {"attention_0": layer, "attention_1": layer}, "head": {"kernel": jnp.ones(2)}}
    scanned = {"encoder": stack_layers(flat["encoder"], 2), "head": flat["head"]}
    _, flat_steps = _updates(flat, every=1, steps=3)
    _, scanned_steps = _updates(scanned, every=1, steps=3)
    for f, s in zip(flat_steps, scanned_steps):
        jax.tree.map(np.testing.assert_allclose, s["encoder"], stack_layers(f["encoder"], 2))
    kernel = next(iter(jax.tree.leaves(scanned_steps[1]["encoder"]["layers"])))
    assert (np.asarray(kernel[0]) == 0).all() and (np.asarray(kernel[1]) != 0).all()  # layer 0 frozen, layer 1 thawed


def test_a_gradually_unfrozen_run_keeps_the_lower_layers_until_their_epoch(tmp_path):
    """Fixture SST-2 (8 rows, batch 8: one step an epoch), unfreezing every 2 epochs over 4 steps:
    the head trains from step 1, the top layer from step 3, the embeddings never."""
    c = tiny("sst2", "glue/SST-2", total_steps=4, unfreeze_every_epochs=2.0, checkpoint_every=1, keep_checkpoints=10)
    c.optimizer.schedule = "slanted_triangular"
    result = finetune(c, tmp_path)
    from bertology.train.checkpoint import load_params

    params = {step: load_params(tmp_path, step)[0] for step in (1, 2, 3, 4)}
    fresh = params[1]
    changed = lambda a, b: not np.array_equal(np.asarray(a), np.asarray(b))  # noqa: E731
    assert changed(params[2]["head"]["kernel"], fresh["head"]["kernel"])
    top = f"ffn_{c.model.num_layers - 1}"
    assert not changed(params[2]["encoder"][top]["output"]["kernel"], fresh["encoder"][top]["output"]["kernel"])
    assert changed(params[4]["encoder"][top]["output"]["kernel"], params[2]["encoder"][top]["output"]["kernel"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params[4]["encoder"]["embeddings"],
                 fresh["encoder"]["embeddings"])
    assert result["steps"] == 4


def test_unfreezing_a_partly_frozen_trunk_is_refused(tmp_path):
    with pytest.raises(UserError, match="unfreeze_every_epochs thaws the whole trunk.*set mode='full'"):
        finetune(tiny("sst2", "glue/SST-2", mode="adapters", unfreeze_every_epochs=1.0), tmp_path)
    assert not (tmp_path / "checkpoints").exists()
