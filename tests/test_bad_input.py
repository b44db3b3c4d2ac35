"""Bad input to every CLI: exit status 2, one line on stderr naming the key or file, no traceback,
and nothing left in the output path that a rerun would trip over.

Each case runs the CLI's `main` in-process (the conftest gives 8 simulated CPU devices, so a batch
that does not divide over them is a real case). The inputs are made once per module by `make_inputs`.
"""

from __future__ import annotations

import pathlib
import shutil
import types

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest
from etils import epath
from helpers import REPO

from bertology import convert, features, finetune, models, pretrain, sweep, tokenizer, validation
from bertology.data import corpus as corpus_lib
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.train.checkpoint import Checkpointer
from bertology.train.run import write_config

WORDS = ("the", "model", "reads", "a", "sentence", "and", "returns", "its", "value", "for", "each", "token")

MAINS = {
    "pretrain": pretrain.main, "finetune": finetune.main, "sweep": sweep.main, "convert": convert.main,
    "tokenizer": tokenizer.main, "features": features.main,
}


def _run_dir(workdir: pathlib.Path, config: ml_collections.ConfigDict, example: dict) -> str:
    """A run directory as pretraining leaves it (config.json + a step-0 checkpoint), random weights."""
    config.model.vocab_size = load_tokenizer(config.data.vocab or DEFAULT_VOCAB).vocab_size
    model = models.build(config.model)
    params = jax.tree.map(np.asarray, nn.meta.unbox(model.init(jax.random.key(0), example)["params"]))
    write_config(config, epath.Path(workdir))
    checkpointer = Checkpointer(workdir, keep=1)
    checkpointer.save(0, {"step": np.zeros((), np.int32), "params": params}, {})
    checkpointer.wait()
    checkpointer.close()
    return str(workdir)


def make_inputs(root: pathlib.Path) -> types.SimpleNamespace:
    """Every file the cases point at: a small real corpus, non-text corpora, runs, broken files."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    docs = ["\n".join(" ".join(rng.choice(WORDS, 8)) + " ." for _ in range(6)) for _ in range(40)]
    text = root / "corpus.txt"
    text.write_text("\n\n".join(docs) + "\n")
    def binary(n: int) -> bytes:  # random bytes, broken into "lines" and "documents" as binary files often are
        return b"\n\n".join(rng.integers(0, 256, 2000, dtype=np.uint8).tobytes() for _ in range(n // 2000))

    noise = root / "noise.bin"
    noise.write_bytes(binary(100_000))
    images = root / "images"
    images.mkdir()
    (images / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + binary(50_000))
    (images / "b.tar.gz").write_bytes(b"\x1f\x8b\x08\x00" + binary(50_000))
    bad_json = root / "hf_bad_json"
    bad_json.mkdir()
    (bad_json / "config.json").write_text("{'model_type': 'bert',")  # a python dict, not JSON
    list_json = root / "hf_list_json"
    list_json.mkdir()
    (list_json / "config.json").write_text("[1, 2]")
    small_vocab = root / "small_vocab.txt"
    small_vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."]))

    bert = ml_collections.ConfigDict(sweep.load_config(REPO / "configs" / "bert.py", "tiny").to_dict())
    bert_example = {"input_ids": np.ones((1, 4), np.int32), "input_mask": np.ones((1, 4), np.int32),
                    "segment_ids": np.zeros((1, 4), np.int32), "masked_positions": np.zeros((1, 2), np.int32)}
    bert_run = _run_dir(root / "bert_run", bert, bert_example)
    broken_run = root / "broken_run"  # a run whose config.json was cut off mid-write
    shutil.copytree(bert_run, broken_run)
    (broken_run / "config.json").write_text((broken_run / "config.json").read_text()[:40])
    return types.SimpleNamespace(
        root=root, text=str(text), noise=str(noise), images=str(images), bad_json=str(bad_json),
        list_json=str(list_json), small_vocab=str(small_vocab), bert_run=bert_run, broken_run=str(broken_run),
    )


# Pretraining cases start from a config that would train 2 steps on the small corpus; each case
# replaces or adds overrides.
PRETRAIN = {"total_steps": "2", "batch_size": "8", "eval_every": "0", "log_every": "1", "data.dupe_factor": "1",
            "data.max_seq_length": "32", "data.max_predictions_per_seq": "5"}


def _pretrain(config: str = "configs/bert.py:tiny", **overrides: str):
    def argv(p: types.SimpleNamespace) -> list[str]:
        keys = {**PRETRAIN, "data.corpus": p.text, **{k.replace("__", "."): v.format(p=p) for k, v in overrides.items()}}
        return ["pretrain", f"--config={config}", f"--workdir={p.out}", *(f"--config.{k}={v}" for k, v in keys.items())]
    return argv


def _finetune(**overrides: str | None):
    """Fine-tuning the embedded task for 2 steps, with `overrides`; None leaves a key at the config's value."""
    def argv(p: types.SimpleNamespace) -> list[str]:
        keys = {"total_steps": "2", "batch_size": "8", "eval_batch_size": "8"}
        for key, value in overrides.items():
            if value is None:
                keys.pop(key.replace("__", "."))
            else:
                keys[key.replace("__", ".")] = value.format(p=p)
        return ["finetune", "--config=configs/finetune/embedded.py", f"--workdir={p.out}", *(f"--config.{k}={v}" for k, v in keys.items())]
    return argv


def _args(*args: str):
    return lambda p: [a.format(p=p) for a in args]


# (id, cli, argv(paths), what the one line must contain). `{p.out}` is the path that must not be left behind.
CASES = [
    ("total_steps=0", "pretrain", _pretrain(total_steps="0"), "total_steps=0"),
    ("total_steps<0", "pretrain", _pretrain(total_steps="-5"), "total_steps=-5"),
    ("batch_size=0", "pretrain", _pretrain(batch_size="0"), "batch_size=0"),
    ("checkpoint_every=0", "pretrain", _pretrain(checkpoint_every="0"), "checkpoint_every=0"),
    ("log_every=0", "pretrain", _pretrain(log_every="0"), "log_every=0"),
    ("rotary base <= 0", "pretrain", _pretrain("configs/modernbert.py:tiny", model__rope_theta="-1.0",
                                                     data__max_predictions_per_seq="10"),
     "model.rope_theta=-1.0"),
    ("longformer window from the command line", "pretrain",
     _pretrain("configs/longformer.py:tiny", model__attention_window="(3,)"), "model.attention_window=[3]: each a positive even"),
    ("checkpoint_every_minutes<0", "pretrain", _pretrain(checkpoint_every_minutes="-1.0"), "checkpoint_every_minutes=-1.0"),
    ("eval_every<0", "pretrain", _pretrain(eval_every="-1"), "eval_every=-1"),
    ("keep_checkpoints=0", "pretrain", _pretrain(keep_checkpoints="0"), "keep_checkpoints=0"),
    ("learning_rate<0", "pretrain", _pretrain(optimizer__learning_rate="-0.001"), "optimizer.learning_rate=-0.001"),
    ("warmup_steps<0", "pretrain", _pretrain(optimizer__warmup_steps="-10"), "optimizer.warmup_steps=-10"),
    ("weight_decay<0", "pretrain", _pretrain(optimizer__weight_decay="-0.1"), "optimizer.weight_decay=-0.1"),
    ("b2>=1", "pretrain", _pretrain(optimizer__b2="1.5"), "optimizer.b2=1.5"),
    ("optimizer.name", "pretrain", _pretrain(optimizer__name="sgd"), "optimizer.name='sgd'"),
    ("grad_accum_steps=0", "pretrain", _pretrain(grad_accum_steps="0"), "grad_accum_steps=0"),
    ("grad_accum indivisible", "pretrain", _pretrain(grad_accum_steps="3"), "grad_accum_steps=3"),
    ("batch over devices", "pretrain", _pretrain(batch_size="12"), "batch_size=12"),
    ("dropout=1.5", "pretrain", _pretrain(model__dropout_rate="1.5"), "model.dropout_rate=1.5"),
    ("attention dropout<0", "pretrain", _pretrain(model__attention_dropout_rate="-0.1"), "model.attention_dropout_rate=-0.1"),
    ("max_seq_length>positions", "pretrain", _pretrain(data__max_seq_length="1024"), "data.max_seq_length=1024"),
    ("dupe_factor=0", "pretrain", _pretrain(data__dupe_factor="0"), "data.dupe_factor=0"),
    ("window_documents=1", "pretrain", _pretrain(data__window_documents="1"), "data.window_documents=1"),
    ("masked_lm_prob past the cap", "pretrain", _pretrain(data__masked_lm_prob="0.5"),
     "data.masked_lm_prob=0.5 asks for round(0.5 * 32) = 16 predictions"),
    ("corpus of random bytes", "pretrain", _pretrain(data__corpus="{p.noise}"), "noise.bin"),
    ("corpus of images and archives", "pretrain", _pretrain(data__corpus="{p.images}"), "a.png"),
    ("finetune batch_size=0", "finetune", _finetune(batch_size="0"), "batch_size=0"),
    ("finetune epochs=0", "finetune", _finetune(total_steps=None, epochs="0"), "epochs=0"),
    ("finetune warmup_fraction>1", "finetune", _finetune(optimizer__warmup_fraction="1.5"), "optimizer.warmup_fraction=1.5"),
    ("finetune layerwise decay 0", "finetune", _finetune(optimizer__layerwise_lr_decay="0.0"), "optimizer.layerwise_lr_decay=0.0"),
    ("finetune quantize int4", "finetune", _finetune(quantize="int4"), "quantize='int4' is not one of 'none', 'int8'"),
    ("finetune prune sparsity 1", "finetune", _finetune(prune__kind="magnitude", prune__sparsity="1.0"), "prune.sparsity=1.0"),
    ("finetune from a run whose config.json is not JSON", "finetune",
     _finetune(init_checkpoint="{p.broken_run}"), "config.json is not JSON"),
    ("finetune vocab differs from checkpoint", "finetune",
     _finetune(init_checkpoint="{p.bert_run}", data__vocab="{p.small_vocab}"), "data.vocab"),
    ("sweep budget 0", "sweep", _args("sweep", "--config=configs/sweep/equal_flops.py", "--workdir={p.out}",
                                      "--config.budgets=(0.0,)"), "budgets"),
    ("sweep unknown family", "sweep", _args("sweep", "--config=configs/sweep/equal_flops.py", "--workdir={p.out}",
                                            "--config.families=('bert','gpt9')"), "gpt9"),
    ("sweep with neither families nor variants", "sweep", _args(
        "sweep", "--config=configs/sweep/equal_flops.py", "--workdir={p.out}", "--config.families=()"),
     "names no config in configs/: none given"),
    ("sweep batch_size=0", "sweep", _args("sweep", "--config=configs/sweep/equal_flops.py", "--workdir={p.out}",
                                          "--config.batch_size=0"), "batch_size=0"),
    ("convert config.json not JSON", "convert", _args("--from", "hf", "--in", "{p.bad_json}", "--out", "{p.out}"), "config.json"),
    ("convert config.json not an object", "convert", _args("--from", "hf", "--in", "{p.list_json}", "--out", "{p.out}"),
     "config.json"),
    ("convert --to hf of a step it lacks", "convert", _args("--to", "hf", "--in", "{p.bert_run}", "--out", "{p.out}",
                                                            "--step", "7"), "has no checkpoint of step 7; its steps are 0"),
    ("convert --from hf into a run", "convert", _args("--from", "hf", "--in", "{p.bad_json}", "--out", "{p.bert_run}"),
     "already exists and is not empty; pass a new directory"),
    ("tokenizer corpus of random bytes", "tokenizer", _args("--corpus", "{p.noise}", "--vocab_size", "500", "--kind",
                                                            "wordpiece", "--out", "{p.out}.txt"), "noise.bin"),
    ("features input of random bytes", "features", _args("features", "--checkpoint={p.bert_run}", "--input={p.noise}",
                                                         "--out={p.out}.npz"), "noise.bin"),
    ("features max_seq_length=1", "features", _args("features", "--checkpoint={p.bert_run}", "--input={p.text}",
                                                    "--max_seq_length=1", "--out={p.out}.npz"), "max_seq_length"),
    ("features layers not integers", "features", _args("features", "--checkpoint={p.bert_run}", "--input={p.text}",
                                                       "--layers=last", "--out={p.out}.npz"), "--layers"),
]


def outcome(cli: str, argv: list[str], capsys) -> tuple[int, list[str]]:
    """(exit status, stderr lines) of one CLI run; an exception escaping `main` propagates."""
    code = MAINS[cli](argv)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> types.SimpleNamespace:
    return make_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("cli, make_argv, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(cli, make_argv, expected, inputs, tmp_path, capsys):
    paths = types.SimpleNamespace(**vars(inputs), out=str(tmp_path / "out"))
    code, lines = outcome(cli, make_argv(paths), capsys)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"bertology.{cli}: error: "), lines
    assert expected in lines[0], lines[0]
    assert not list(tmp_path.iterdir()), f"left behind: {list(tmp_path.iterdir())}"


@pytest.mark.parametrize("path, arg", [
    *((f"configs/{family}.py", preset) for family in ("bert", "roberta", "albert", "electra", "spanbert")
      for preset in ("tiny", "base", "large")),
    ("configs/gpt.py", "tiny"), ("configs/gpt.py", "gpt2"),
    ("configs/finetune/glue.py", "mnli"), ("configs/finetune/squad.py", "v2"), ("configs/finetune/conll.py", None),
    ("configs/finetune/swag.py", None), ("configs/finetune/embedded.py", None),
])
def test_every_shipped_config_passes_validation(path, arg):
    """The checks refuse bad values only: every recipe as shipped (8 devices, the default mesh) passes,
    among them fine-tuning's unset total_steps (epochs decide) and the short-run warmup clamp."""
    config = sweep.load_config(REPO / path, *([arg] if arg else []))
    validation.check(config)


def _config_args() -> list[tuple[str, str | None]]:
    """Every config file under configs/ with every argument it takes (None: it takes none), as the
    file's `PRESETS` lists them; a new config file says its own presets, so adding one touches no test."""
    args = []
    for path in sorted((REPO / "configs").glob("**/*.py")):
        name = path.relative_to(REPO).as_posix()
        presets = getattr(sweep.load_module(path), "PRESETS", None)
        assert isinstance(presets, tuple) and presets, (
            f"{name} has no PRESETS tuple: add one after its imports, the arguments its get_config takes "
            "(PRESETS = (None,) where it takes none), so the tests run each through validation")
        args += [(name, arg) for arg in presets]
    return args


def _on_devices_it_divides_over(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config on one device where its batch does not divide over the 8 simulated ones: some
    references' batches (Transformer-XL base's 60, UniLM's 330) are sized for other device counts."""
    from bertology.train import sharding

    mesh = config.get("mesh")
    if mesh is not None and config.batch_size % sharding.batch_devices(sharding.make_mesh(mesh),
                                                                       sharding.rules_for(mesh)):
        config.mesh.shape = (1, 1)
    return config


@pytest.mark.parametrize("path, arg", _config_args())
def test_every_config_and_preset_passes_validation(path, arg):
    """Every config file with every preset passes `validation.check`; a sweep passes `check_sweep`
    and so does every pretraining and fine-tuning config it generates (as `sweep.sweep` checks
    them before its first run). Among them the recipes whose references cap the masked
    predictions below the masking rate on purpose, which say so (`data.allow_capped_predictions`)."""
    config = sweep.load_config(REPO / path, *([arg] if arg else []))
    if not path.startswith("configs/sweep/"):
        validation.check(_on_devices_it_divides_over(config))
        return
    config.configs_dir = str(REPO / "configs")
    validation.check_sweep(config)
    for v in sweep.variants(config):
        pretraining = sweep._pretrain_config(config, v.config, config.reference_steps, v.overrides)
        validation.check(pretraining)
        for target in config.finetune:
            validation.check(sweep._target_config(config, target, pretraining.model.family, None))


def test_warmup_longer_than_the_run_is_allowed():
    """The schedule clamps warmup to total_steps, which short runs of the full recipes rely on."""
    config = sweep.load_config(REPO / "configs" / "bert.py", "base")
    config.total_steps = 3
    validation.check(config)
    assert config.optimizer.warmup_steps == 10_000


def test_stray_bytes_in_real_text_are_replaced_and_counted(tmp_path):
    """Three invalid bytes and a NUL in a text file: the corpus is read, each replaced, and counted in the log."""
    rng = np.random.default_rng(1)
    docs = ["\n".join(" ".join(rng.choice(WORDS, 8)) + " ." for _ in range(6)) for _ in range(10)]
    raw = "\n\n".join(docs).encode()
    raw = raw[:100] + b"\xff" + raw[100:200] + b"\xfe\x00" + raw[200:300] + b"\xc3" + raw[300:]
    path = tmp_path / "stray.txt"
    path.write_bytes(raw)
    assert corpus_lib.check_text([path]) == 4
    logged: list[str] = []
    docs_read = corpus_lib.load_documents(path, load_tokenizer(DEFAULT_VOCAB), DEFAULT_VOCAB, tmp_path / "cache", log=logged.append)
    assert len(docs_read["train"]) + len(docs_read["validation"]) == 10
    assert any("replaced 4 NUL or invalid UTF-8" in line for line in logged), logged
