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

The suite compiles without XLA's backend optimisations (jax's `jax_disable_most_optimizations`:
LLVM at -O0, no expensive passes), exported the same way, so the CLIs and subprocesses a test
starts compile so too. Most tests compile far more than they compute: a tiny train step's gradient
compiles in about a third of the time, the numbers are the same to float32 rounding, and the
whole suite, run both ways on a clean clone of 21d7d40 on the 2-core machine, took 4,294 instead
of 5,468 CPU-seconds (36 instead of 46 minutes) with every test passing. Tests that compute more
than they compile (LSTM scans, the notebook's training) are marked `optimized` and compile as
users' runs do; they ran up to 2x slower without the optimisations.

For the same reason XLA compiles the suite's CPU fusions with its older elemental emitters
(`--xla_cpu_use_fusion_emitters=false`; jaxlib 0.10's default lowers each fusion through MLIR,
which costs more to compile than the loops cost to run). On test_families, test_accumulation and
test_seq2seq (80 tests, 2 workers) compilation fell from 342 to 215 s and the files from 294 to
228 s, every test passing, the 1-vs-8-device equalities included. With the optimisations on, the
older emitters are the slower ones (the MiniLM distillation compiled in 54 s instead of 28 s,
and is no longer marked `optimized`: unoptimised, it ran in 66 s instead of 84 s): the processes
an `optimized` test starts get the default emitters, but XLA reads its flags once per process,
so the `optimized` tests themselves keep the older ones (ELMo's biLM test: 58 s instead of
53 s). A test that starts processes with fewer devices appends its own device count to the
inherited XLA_FLAGS (the last one wins).

Helpers several test files share live in tests/helpers.py (`import helpers`; this file puts
tests/ on sys.path), the fixtures they share here; no test file imports another.
"""

import os
import pathlib
import shutil
import sys
import tempfile

QUICK_FUSIONS = " --xla_cpu_use_fusion_emitters=false"  # compiles faster, unoptimised: see the docstring
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                           + QUICK_FUSIONS).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if str(pathlib.Path(__file__).parent) not in sys.path:  # `import helpers` under any import mode
    sys.path.insert(0, str(pathlib.Path(__file__).parent))

import pytest  # noqa: E402

JAX_CACHE = "JAX_COMPILATION_CACHE_DIR"
DATA_CACHE = "BERTOLOGY_TEST_CACHE"
QUICK_COMPILES = "JAX_DISABLE_MOST_OPTIMIZATIONS"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: use the controller's caches
        return
    os.environ[JAX_CACHE] = tempfile.mkdtemp(prefix="bertology-jax-cache-")
    if DATA_CACHE not in os.environ:
        config._bertology_data_cache = os.environ[DATA_CACHE] = tempfile.mkdtemp(prefix="bertology-data-cache-")
    # Tokenized corpora and the embedded corpus go to the session's cache, never ~/.cache: set
    # before any fixture (module-scoped ones included) and inherited by the workers and subprocesses.
    os.environ["BERTOLOGY_CACHE"] = os.environ[DATA_CACHE]
    # Cache every program: most of the suite's are small, and jax skips by default those that
    # compile in under a second.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    os.environ.setdefault(QUICK_COMPILES, "true")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(JAX_CACHE), ignore_errors=True)
        if getattr(config, "_bertology_data_cache", None):
            shutil.rmtree(os.environ.pop(DATA_CACHE), ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` tests run first, so that the short ones fill in behind them: a minute-long test
    collected near the end kept one of the two workers busy while the other sat idle. (The
    Makefile's `--dist worksteal` lets an idle worker take the other's queued tests; xdist's
    default scheduler hands each worker a fixed first share, which would be all the slow ones.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _optimized(request, monkeypatch):
    """A test marked `optimized` compiles with XLA's optimisations, as do the processes it starts
    (with XLA's default fusion emitters too)."""
    if request.node.get_closest_marker("optimized") is None:
        yield
        return
    import jax

    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    monkeypatch.setenv(QUICK_COMPILES, "false")
    monkeypatch.setenv("XLA_FLAGS", os.environ["XLA_FLAGS"].replace(QUICK_FUSIONS.strip(), "").strip())
    yield
    jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture
def hf_flax():
    """Skips a test that measures against transformers' Flax models: transformers 5 removed them,
    so those baselines run where the `bench` extra installs transformers 4.57."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "FlaxBertForPreTraining"):
        pytest.skip(f"transformers {transformers.__version__} has no Flax models; pip install -e '.[bench]'")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny BERT pretrained for 3 steps on a small text file.

    Its init is 10x BERT's (0.2): at 0.02 a barely trained encoder attends almost uniformly and
    its [CLS] vector hardly depends on the input, so a frozen encoder would give a head nothing.
    """
    from helpers import FIXTURES, TINY, config  # imported here: jax reads this session's cache settings at import

    from bertology.train.loop import train

    root = tmp_path_factory.mktemp("pretrained")
    sentences = [line for line in (FIXTURES / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:]]
    docs = ["\n".join(s.split("\t")[0] for s in sentences[i:i + 2]) for i in range(0, 8, 2)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    c = config("bert", "tiny")
    c.model.update(TINY)
    c.model.initializer_range = 0.2
    c.data.corpus = str(root / "corpus.txt")
    c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
    c.batch_size, c.total_steps, c.eval_every, c.checkpoint_every, c.log_every = 4, 3, 0, 1000, 1
    c.mesh.shape = (1, 1)
    train(c, root / "run")
    return root / "run"
