"""The optimizer's weight-decay rule: the references' (BERT's and XLNet's `optimization.py` skip
every variable whose name contains "bias", and LayerNorm), on real parameter trees."""

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertology import models
from bertology.models import layout
from bertology.train import optimizer as optimizer_lib


def _tiny_params(name: str) -> dict:
    block = ml_collections.ConfigDict(helpers.config(name, "tiny").model.to_dict())
    block.vocab_size = 64
    model = models.build(block)
    batch = {"input_ids": jnp.ones((2, 8), jnp.int32), "input_mask": jnp.ones((2, 8), jnp.int32),
             "segment_ids": jnp.zeros((2, 8), jnp.int32), "masked_positions": jnp.zeros((2, 2), jnp.int32)}
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch, deterministic=True))["params"]
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), nn.meta.unbox(shapes))


@pytest.mark.parametrize("family", ["bert", "xlnet"])
def test_adamw_decays_weights_but_no_bias_or_norm_as_the_references(family):
    """One AdamW step with zero gradients moves only decayed weights, each by lr · wd · w: every
    leaf whose name contains "bias" (XLNet's `lm_bias`, `r_w_bias`, `r_r_bias`, `r_s_bias`; every
    dense bias) and every norm scale stays exactly where it was."""
    params = _tiny_params(family)
    cfg = ml_collections.ConfigDict(dict(name="adamw", learning_rate=0.1, warmup_steps=0, b1=0.9, b2=0.999,
                                         eps=1e-6, weight_decay=0.01, clip_norm=1.0))
    tx, _ = optimizer_lib.make(cfg, 10)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    names = [layout.keys(path)[-1] for path, _ in jax.tree_util.tree_leaves_with_path(params)]
    spared = {n for n in names if "bias" in n or n == "scale"}
    assert "bias" in spared and "scale" in spared
    if family == "xlnet":
        assert {"lm_bias", "r_w_bias", "r_r_bias", "r_s_bias"} <= spared
    for name, w, u in zip(names, jax.tree.leaves(params), jax.tree.leaves(updates)):
        want = np.zeros_like(w) if name in spared else -0.1 * 0.01 * w
        np.testing.assert_allclose(np.asarray(u), want, rtol=1e-5, atol=1e-8, err_msg=name)
