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
The tokenized corpora and the embedded corpus are shared the same way (one `BERTOLOGY_CACHE`
per session, which the data code writes atomically, so two workers may race to build an entry).
"""

import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

JAX_CACHE = "JAX_COMPILATION_CACHE_DIR"
DATA_CACHE = "BERTOLOGY_TEST_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: use the controller's caches
        return
    os.environ[JAX_CACHE] = tempfile.mkdtemp(prefix="bertology-jax-cache-")
    if DATA_CACHE not in os.environ:
        config._bertology_data_cache = os.environ[DATA_CACHE] = tempfile.mkdtemp(prefix="bertology-data-cache-")
    # Cache every program: most of the suite's are small, and jax skips by default those that
    # compile in under a second.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(JAX_CACHE), ignore_errors=True)
        if getattr(config, "_bertology_data_cache", None):
            shutil.rmtree(os.environ.pop(DATA_CACHE), ignore_errors=True)


@pytest.fixture(autouse=True)
def _cache(monkeypatch):
    """Tokenized corpora and the embedded corpus go to the session's cache, never ~/.cache."""
    monkeypatch.setenv("BERTOLOGY_CACHE", os.environ[DATA_CACHE])
