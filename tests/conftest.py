"""Every test process sees 8 simulated CPU devices, so multi-device tests need no subprocess.

Single-device tests build meshes of shape (1, 1), which use the first device only.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    """Tokenized corpora and the embedded corpus go to one per-session temp cache, never ~/.cache."""
    cache = os.environ.get("BERTOLOGY_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "bertology-cache")
    monkeypatch.setenv("BERTOLOGY_CACHE", cache)
