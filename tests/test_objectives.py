"""BERT's losses against numpy references."""

import numpy as np
import jax.numpy as jnp
from scipy.special import log_softmax

from bertology.objectives.bert import mlm_loss, nsp_loss


def test_mlm_loss_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 6, 50)) * 3
    ids = rng.integers(0, 50, (4, 6))
    w = (rng.random((4, 6)) < 0.7).astype(np.float32)
    w[0] = 0  # a row with no predictions at all
    ids[:, 0] = logits[:, 0].argmax(-1)  # some certainly-correct predictions
    loss, m = mlm_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(ids), jnp.asarray(w))
    nll = -np.take_along_axis(log_softmax(logits, -1), ids[..., None], -1)[..., 0]
    ref = (nll * w).sum() / (w.sum() + 1e-5)
    acc = ((logits.argmax(-1) == ids) * w).sum() / (w.sum() + 1e-5)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(m["mlm_accuracy"], acc, rtol=1e-5)
    # Padded prediction slots contribute nothing, whatever their logits.
    logits2 = logits.copy()
    logits2[w == 0] = rng.normal(size=logits2[w == 0].shape) * 10
    np.testing.assert_allclose(mlm_loss(jnp.asarray(logits2, jnp.float32), jnp.asarray(ids), jnp.asarray(w))[0], loss, rtol=1e-6)


def test_nsp_loss_matches_numpy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(9, 2)) * 2
    labels = rng.integers(0, 2, 9)
    loss, m = nsp_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(labels))
    ref = -log_softmax(logits, -1)[np.arange(9), labels].mean()
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(m["nsp_accuracy"], (logits.argmax(-1) == labels).mean(), rtol=1e-6)
