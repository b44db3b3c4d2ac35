"""Every test process sees 8 simulated CPU devices, so multi-device tests need no subprocess.

Single-device tests build meshes of shape (1, 1), which use the first device only.

One test session shares one fresh JAX persistent compilation cache: many tests compile the same
small programs (tiny BERT train steps, reference models), and with the cache each is compiled once
per session instead of once per test or per process. The session's first process (the xdist
controller, or the only process without xdist) creates the directory and exports it through
jax's environment variables, which jax reads at import; the xdist workers and every Python
process a test starts (CLIs, the multihost run, the notebook kernel) inherit them. The cache
lives only as long as the session, so no test can pass because of an executable compiled by an
older version of the code. `JAX_ENABLE_COMPILATION_CACHE=false` runs a session without it.
"""

import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

JAX_CACHE = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: use the controller's cache
        return
    os.environ[JAX_CACHE] = tempfile.mkdtemp(prefix="bertology-jax-cache-")
    # Cache every program: most of the suite's are small, and jax skips by default those that
    # compile in under a second.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(JAX_CACHE), ignore_errors=True)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    """Tokenized corpora and the embedded corpus go to one per-session temp cache, never ~/.cache."""
    cache = os.environ.get("BERTOLOGY_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "bertology-cache")
    monkeypatch.setenv("BERTOLOGY_CACHE", cache)
