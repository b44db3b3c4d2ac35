"""BERT's losses against numpy references: undivided sums, and one batch's divided values."""

import numpy as np
import jax.numpy as jnp
from scipy.special import log_softmax

from bertology.objectives.bert import mlm_loss, mlm_means, nsp_loss, nsp_means


def test_mlm_means_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 6, 50)) * 3
    ids = rng.integers(0, 50, (4, 6))
    w = (rng.random((4, 6)) < 0.7).astype(np.float32)
    w[0] = 0  # a row with no predictions at all
    ids[:, 0] = logits[:, 0].argmax(-1)  # some certainly-correct predictions
    m = mlm_means(jnp.asarray(logits, jnp.float32), jnp.asarray(ids), jnp.asarray(w))
    nll = -np.take_along_axis(log_softmax(logits, -1), ids[..., None], -1)[..., 0]
    correct = logits.argmax(-1) == ids
    np.testing.assert_allclose(m["mlm_loss"].total, (nll * w).sum(), rtol=1e-5)
    np.testing.assert_allclose(m["mlm_accuracy"].total, (correct * w).sum(), rtol=1e-6)
    assert float(m["mlm_loss"].weight) == w.sum() and m["mlm_loss"].eps == 1e-5
    # One batch's values divide by BERT's sum(w) + 1e-5.
    loss, metrics = mlm_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(ids), jnp.asarray(w))
    np.testing.assert_allclose(loss, (nll * w).sum() / (w.sum() + 1e-5), rtol=1e-5)
    np.testing.assert_allclose(metrics["mlm_accuracy"], (correct * w).sum() / (w.sum() + 1e-5), rtol=1e-5)
    # Padded prediction slots contribute nothing, whatever their logits.
    logits2 = logits.copy()
    logits2[w == 0] = rng.normal(size=logits2[w == 0].shape) * 10
    np.testing.assert_allclose(mlm_loss(jnp.asarray(logits2, jnp.float32), jnp.asarray(ids), jnp.asarray(w))[0], loss, rtol=1e-6)


def test_nsp_means_match_numpy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(9, 2)) * 2
    labels = rng.integers(0, 2, 9)
    m = nsp_means(jnp.asarray(logits, jnp.float32), jnp.asarray(labels))
    nll = -log_softmax(logits, -1)[np.arange(9), labels]
    np.testing.assert_allclose(m["nsp_loss"].total, nll.sum(), rtol=1e-5)
    assert float(m["nsp_loss"].weight) == 9 and m["nsp_loss"].eps == 0  # a plain mean over the rows
    loss, metrics = nsp_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(labels))
    np.testing.assert_allclose(loss, nll.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["nsp_accuracy"], (logits.argmax(-1) == labels).mean(), rtol=1e-6)
