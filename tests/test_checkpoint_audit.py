"""The checkpoint manifest's fingerprints: a numpy reference, host and device paths that agree,
independence from sharding, and sensitivity to one flipped bit or two swapped elements."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bertology.train import checkpoint


def np_mix(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def np_fingerprint(x):
    """The manifest's rule in numpy: per element a mix of (bits, row-major index), summed mod 2**32."""
    x = np.asarray(x).ravel()
    bits = x.astype(np.uint8) if x.dtype == np.bool_ else x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
    bits, index = bits.astype(np.uint32), np.arange(x.size, dtype=np.uint32)
    a = np_mix(bits ^ np_mix(index + np.uint32(0x9E3779B9)))
    b = np_mix(bits + np_mix(index ^ np.uint32(0x7F4A7C15)))
    return f"{int(a.sum(dtype=np.uint32)):08x}{int(b.sum(dtype=np.uint32)):08x}"


def make_state(rng):
    return {
        "big": rng.normal(size=(300, 256)).astype(np.float32),  # over HOST_MAX_SIZE: on the devices
        "bias": rng.normal(size=(7,)).astype(np.float32),
        "half": rng.normal(size=(3, 5)).astype(ml_dtypes.bfloat16),
        "ids": rng.integers(-5, 5, size=(4, 3)).astype(np.int32),
        "keep": rng.random((6,)) < 0.5,
        "bytes": rng.integers(0, 255, size=(9,)).astype(np.uint8),
        "step": np.array(12, np.int32),
        "empty": np.zeros((0, 4), np.float32),
    }


def test_fingerprints_equal_the_numpy_rule_on_both_paths():
    state = make_state(np.random.default_rng(0))
    assert state["big"].size > checkpoint.HOST_MAX_SIZE
    prints, finite = checkpoint.audit(jax.tree.map(jnp.asarray, state))
    assert finite
    assert prints == {f"['{k}']": np_fingerprint(v) for k, v in state.items()}
    # The device's reduction gives a small leaf what the host gave it.
    for k in "bias", "half", "keep", "step":
        assert "".join(f"{int(v):08x}" for v in checkpoint.fingerprint(jnp.asarray(state[k]))) == prints[f"['{k}']"]


def test_eight_byte_elements_get_the_same_fingerprint_on_host_and_device():
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(5).normal(size=(4, 6)))
        assert x.dtype == jnp.float64
        host = checkpoint.audit({"x": x})[0]["['x']"]
        assert "".join(f"{int(v):08x}" for v in checkpoint.fingerprint(x)) == host


def test_fingerprints_do_not_depend_on_sharding():
    """Sharded leaves are fingerprinted on the devices, small replicated ones on the host: same prints."""
    state = make_state(np.random.default_rng(1))
    state["wide"] = np.random.default_rng(2).normal(size=(16, 8)).astype(np.float32)  # small but sharded below
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    spec = {"big": P("data", "model"), "wide": P("model", None)}
    sharded = {k: jax.device_put(v, NamedSharding(mesh, spec.get(k, P()))) for k, v in state.items()}
    one_device = jax.tree.map(jnp.asarray, state)
    assert checkpoint.audit(sharded) == checkpoint.audit(one_device)
    assert checkpoint.audit(sharded)[0]["['wide']"] == np_fingerprint(state["wide"])


@pytest.mark.parametrize("leaf", ["big", "bias", "half"])
def test_one_flipped_bit_or_two_swapped_elements_change_the_fingerprint(leaf):
    state = make_state(np.random.default_rng(3))
    base = checkpoint.audit(jax.tree.map(jnp.asarray, state))[0]
    flipped = {**state, leaf: state[leaf].copy()}
    flipped[leaf].reshape(-1).view(np.uint8)[5] ^= 1
    swapped = {**state, leaf: state[leaf].copy()}
    flat = swapped[leaf].reshape(-1)
    flat[[0, 1]] = flat[[1, 0]]
    for changed in flipped, swapped:
        prints = checkpoint.audit(jax.tree.map(jnp.asarray, changed))[0]
        assert {k for k in prints if prints[k] != base[k]} == {f"['{leaf}']"}


@pytest.mark.parametrize("leaf", ["big", "bias", "half"])
def test_a_nan_or_inf_anywhere_is_found(leaf):
    for bad in np.nan, np.inf:
        state = make_state(np.random.default_rng(4))
        state[leaf].reshape(-1)[-1] = bad
        assert not checkpoint.audit(jax.tree.map(jnp.asarray, state))[1]
