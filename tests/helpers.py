"""What several test files share, in one place: the repository's paths, the one loader of the
configs (`config`), and the small configs, runs, models and data more than one file builds.

Test files import from here (`import helpers`, `from helpers import tiny`), never from one
another; tests/conftest.py puts tests/ on sys.path and holds the shared pytest fixtures
(`pretrained`). Each helper keeps the name it had in the file it came from (noted in its
section), except where two files had different helpers of one name.
"""

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath
from scipy.special import erf

from bertology import models, objectives
from bertology.objectives import Mean, Objective, Terms
from bertology.sweep import load_config
from bertology.train import optimizer as optimizer_lib
from bertology.train import run as run_lib
from bertology.train import sharding
from bertology.train.checkpoint import Checkpointer
from bertology.train.finetune import default_config, finetune
from bertology.train.run import write_config

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def config(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of configs/<name>.py (`name` may be a subpath: "finetune/glue"), as
    `--config configs/<name>.py:<arg>` loads it; `arg` None calls `get_config()`. Each call runs
    the file afresh, so no two callers share a config."""
    return load_config(REPO / "configs" / f"{name}.py", *([] if arg is None else [arg]))


# --- fine-tuning (was in test_finetune.py) -----------------------------------------------------------

TINY = dict(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, max_position_embeddings=64)


def tiny(task, data_dir=None, **overrides):
    c = default_config(task)
    c.model.update(TINY)
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    c.data.dir = str(FIXTURES / data_dir) if data_dir else None
    c.data.max_seq_length = 48
    c.data.doc_stride = 16
    c.data.max_query_length = 16
    c.batch_size = c.eval_batch_size = 8
    c.total_steps = 40
    c.log_every = 1
    c.optimizer.learning_rate = 3e-3
    c.mesh.shape = (1, 1)
    for k, v in overrides.items():
        node, *path = c, *k.split(".")
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = v
    return c


def sst2_from(checkpoint: pathlib.Path, workdir: pathlib.Path, *, steps: int, max_seq_length: int, drop: float,
              **overrides) -> dict:
    """A pretraining run of any family fine-tuned on the SST-2 fixture (batch 8, lr 3e-3, one
    device; `overrides` of the fine-tuning config's top-level keys): the mean loss of the last 5
    steps is `drop` below the first 5's. Returns the result."""
    c = default_config("sst2")
    c.update(init_checkpoint=str(checkpoint), total_steps=steps, batch_size=8, eval_batch_size=8, log_every=1,
             **overrides)
    c.data.update(dir=str(FIXTURES / "glue" / "SST-2"), max_seq_length=max_seq_length)
    c.optimizer.learning_rate = 3e-3
    c.mesh.shape = (1, 1)
    result = finetune(c, workdir)
    loss = np.array(result["train_loss"])
    assert loss[-5:].mean() < loss[:5].mean() - drop, loss
    return result


def _two_topic_sst2(root: pathlib.Path, vocab: str) -> pathlib.Path:
    """An SST-2-layout task whose label is the topic of the words (files vs numbers), all of them
    in the biLM's word vocabulary. (Was in test_elmo.py.)"""
    topics = [["file", "open", "read", "path", "directory", "write", "close"],
              ["number", "integer", "float", "value", "sum", "zero", "int"]]
    known = set(pathlib.Path(vocab).read_text().split())
    assert all(w in known for t in topics for w in t)
    rng = np.random.default_rng(0)
    (root / "SST-2").mkdir(parents=True)
    for split, n in (("train", 96), ("dev", 16)):
        labels = np.arange(n) % 2
        lines = [" ".join(rng.choice(topics[y], rng.integers(3, 7))) + f"\t{y}" for y in labels]
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    return root / "SST-2"


# --- pretraining (was in test_train.py) --------------------------------------------------------------


def tiny_config(**overrides):
    c = config("bert", "tiny")
    c.batch_size = 16
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.total_steps = 50
    c.log_every = 1
    c.eval_every = 0
    c.checkpoint_every = 1000
    c.mesh.shape = (1, 1)
    for k, v in overrides.items():
        node = c
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    return c


# --- distillation (test_tinybert.py's `_config` and `RUN`, renamed; was in test_distil.py) ----------

SHORT_RUN = {"data.max_seq_length": 32, "data.max_predictions_per_seq": 5, "batch_size": 8, "mesh.shape": (1, 1),
             "log_every": 5, "eval_every": 0, "checkpoint_every": 1000, "optimizer.warmup_steps": 5}


def short_run_config(name, preset, run=SHORT_RUN, **overrides):
    """`config(name, preset)` with the short run's settings `run`, then `overrides` (dotted keys)."""
    c = config(name, preset)
    for key, value in {**run, **overrides}.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def assert_teacher_frozen_while_the_student_trains(config, batch, teacher, expected, workdir, steps):
    """`steps` training steps on `batch` with `teacher` in the run: the student's parameters move,
    the teacher as placed on the mesh stays bit-identical to `expected` (dtype included)."""

    class Rows:
        def __next__(self):
            return batch

        def get_state(self):
            return {}

        def set_state(self, state):
            pass

    with run_lib.setup(ml_collections.FrozenConfigDict(config), workdir, model=models.build(config.model),
                       objective=objectives.get(config.objective), example={k: v[:1] for k, v in batch.items()},
                       optimizer=lambda _: optimizer_lib.make(config.optimizer, config.total_steps),
                       teacher=teacher) as run:
        before = jax.tree.map(np.array, run.state["params"])
        run.fit(Rows(), steps)
        after_teacher = jax.tree.map(np.asarray, run.teacher_params)
        changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), before, run.state["params"]))
    assert any(changed), "the student trains"
    same = jax.tree.map(lambda a, b: a.dtype == b.dtype and np.array_equal(a, b), expected, after_teacher)
    assert jax.tree.all(same)


# --- run directories (was in test_generation.py) -----------------------------------------------------


def max_diff(a: dict, b: dict, mask: np.ndarray | None = None) -> dict[str, float]:
    """The largest absolute difference of each output of two models (dicts of arrays, same keys):
    at the real tokens (`mask` > 0) for outputs whose leading axes are the mask's [batch, length],
    everywhere for the others (pooled vectors, per-row logits) and wherever no mask is given. The
    parity tests compare at real tokens because what a padded position holds is each library's
    own choice (Hugging Face zeroes some, leaves others), and no real token reads it."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))

    def diff(key: str) -> float:
        d = np.abs(np.asarray(a[key]) - np.asarray(b[key]))
        return float((d[mask > 0] if mask is not None and d.shape[:2] == mask.shape else d).max())

    return {k: diff(k) for k in a}


def write_run(workdir: pathlib.Path, config: ml_collections.ConfigDict, params) -> pathlib.Path:
    """A run directory as pretraining leaves it: config.json and a step-0 checkpoint."""
    write_config(config, epath.Path(workdir))
    checkpointer = Checkpointer(workdir, keep=1)
    checkpointer.save(0, {"step": np.zeros((), np.int32), "params": params}, {})
    checkpointer.wait()
    checkpointer.close()
    return workdir


def random_params(config: ml_collections.ConfigDict) -> dict:
    """A pretraining model's random parameters, initialised on inputs every family here reads."""
    model = models.build(config.model)
    n = config.data.max_seq_length
    batch = {k: np.zeros((1, n), np.int32) for k in ("input_ids", "segment_ids", "input_mask", "masked_positions")}
    batch.update(perm_mask=np.zeros((1, n, n), np.float32), target_mapping=np.zeros((1, 1, n), np.float32))  # XLNet's
    return nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch)["params"])


# --- the run setup with a bigram causal LM (was in test_run.py; its V, B, L and `config` renamed) ----

BIGRAM_VOCAB, BIGRAM_BATCH, BIGRAM_LENGTH = 12, 8, 6


class Bigram(nn.Module):
    """Next-token logits from the current token alone: the smallest causal LM."""

    @nn.compact
    def __call__(self, batch, deterministic=True):
        init = nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
        return nn.Embed(BIGRAM_VOCAB, BIGRAM_VOCAB, embedding_init=init)(batch["input_ids"])


def lm_loss(params, batch, rng, model):
    logits = model.apply({"params": params}, batch)
    nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
    return Terms(loss={"lm_loss": 1.0}, means={"lm_loss": Mean.of(nll, batch["target_weights"], eps=1e-5)})


LM = Objective(lm_loss, {"perplexity": lambda m: jnp.exp(m["lm_loss"])})


def lm_batch(rng, easy, weighted_rows):
    """`easy`: each target is its input token (which `confident` params predict well); else random."""
    ids = rng.integers(0, BIGRAM_VOCAB, (BIGRAM_BATCH, BIGRAM_LENGTH)).astype(np.int32)
    targets = ids if easy else rng.integers(0, BIGRAM_VOCAB, (BIGRAM_BATCH, BIGRAM_LENGTH)).astype(np.int32)
    weights = (np.arange(BIGRAM_BATCH) < weighted_rows)[:, None] * np.ones(BIGRAM_LENGTH, np.float32)
    return {"input_ids": ids, "targets": targets, "target_weights": weights.astype(np.float32)}


class Cycle:
    """Batches in a fixed cycle, with the position a checkpoint keeps."""

    def __init__(self, batches):
        self.batches, self.i = batches, 0

    def __next__(self):
        self.i += 1
        return self.batches[(self.i - 1) % len(self.batches)]

    def get_state(self):
        return {"i": self.i}

    def set_state(self, state):
        self.i = state["i"]


def bigram_config(**overrides):
    """The run settings of the bigram LM's runs (test_run's `config`)."""
    c = ml_collections.ConfigDict(dict(seed=0, mesh=sharding.mesh_config("dp", (1, 1)), batch_size=BIGRAM_BATCH,
                                       grad_accum_steps=2, log_every=1, eval_every=2, checkpoint_every=1000,
                                       keep_checkpoints=1))
    c.update(overrides)
    return c


# --- small random Hugging Face encoder-decoders (was in test_interop_seq2seq.py: V, T5_SMALL, HF) ---
# torch and transformers are imported where used: files that need them skip without them.

HF_SEQ2SEQ_VOCAB = 71


def hf_seq2seq_models() -> dict:
    """name: (class, config class, config) of the small random T5 (v1.0, v1.1), mT5 and BART."""
    import transformers

    V = HF_SEQ2SEQ_VOCAB
    # d_kv differs from d_model / num_heads (as in mT5-small: 512, 6 heads of 64), few buckets so that
    # offsets beyond the exact range and beyond max_distance both occur within 9 tokens.
    T5_SMALL = dict(vocab_size=V, d_model=24, d_kv=10, num_heads=3, d_ff=40, num_layers=2,
                    relative_attention_num_buckets=8, relative_attention_max_distance=6, dropout_rate=0.15,
                    layer_norm_epsilon=1e-5)
    return {  # name: (class, config class, config)
        "t5_v1_0": (transformers.T5ForConditionalGeneration, transformers.T5Config,
                    dict(T5_SMALL, feed_forward_proj="relu", tie_word_embeddings=True)),
        "t5_v1_1": (transformers.T5ForConditionalGeneration, transformers.T5Config,
                    dict(T5_SMALL, feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
        "mt5": (transformers.MT5ForConditionalGeneration, transformers.MT5Config, T5_SMALL),
        "bart": (transformers.BartForConditionalGeneration, transformers.BartConfig,
                 dict(vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=20,
                      dropout=0.15, attention_dropout=0.05, activation_dropout=0.1, scale_embedding=True)),
    }


def build_hf(name: str, seed: int = 0, **edits):
    """A random HF model, every parameter (and BART's output bias buffer) drawn from N(0, 0.3)."""
    import torch

    torch.manual_seed(seed)
    cls, config_cls, config = hf_seq2seq_models()[name]
    model = cls(config_cls(**{**config, **edits}, attn_implementation="eager"))
    if name in ("t5_v1_1", "mt5") and model.lm_head.weight is model.shared.weight:
        # transformers 5 ties every T5's and mT5's output layer when it builds one; the released
        # v1.1 and mT5 checkpoints (and transformers 4's) have their own, as this model must
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.3)
    return model.eval()


# --- decoding against transformers' generate (was in test_beam.py; its SOURCE_LENGTHS renamed) -----

BEAM_SOURCE_LENGTHS = (9, 4, 6, 2)  # right-padded rows of one batch
NEW = 8
START = {"bart": 2, "t5_v1_0": 0, "t5_v1_1": 0}  # decoder_start_token_id: BART's EOS, T5's pad


def hf_generate(hf, sources, eos: int, start: int, **settings):
    import torch

    ids, mask = sources
    with torch.no_grad():
        return hf.generate(
            input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long(), max_new_tokens=NEW,
            do_sample=False, eos_token_id=eos, pad_token_id=hf.config.pad_token_id, decoder_start_token_id=start,
            no_repeat_ngram_size=0, forced_eos_token_id=None, forced_bos_token_id=None, min_length=0,
            repetition_penalty=1.0, return_dict_in_generate=True, output_scores=True, **settings)


def until_eos(row, eos: int) -> list[int]:
    """The tokens up to and including the first EOS (what follows is each library's filler)."""
    row = [int(t) for t in row]
    return row[: row.index(eos) + 1] if eos in row else row


def save_to_disk(directory, rows, shards=2):
    """A directory as `datasets.Dataset.save_to_disk` writes it: Arrow IPC stream shards
    `data-0000i-of-0000n.arrow`, `state.json` listing them, `dataset_info.json`."""
    import pyarrow as pa

    directory.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    size = -(-len(rows) // shards)
    files = []
    for i in range(shards):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(i * size, size))
        files.append({"filename": name})
    (directory / "state.json").write_text(json.dumps({"_data_files": files, "_fingerprint": "f", "_format_columns": None,
                                                      "_format_kwargs": {}, "_format_type": None,
                                                      "_output_all_columns": False, "_split": "train"}))
    (directory / "dataset_info.json").write_text(json.dumps({"features": {c: {"dtype": "string", "_type": "Value"}
                                                                          for c in table.column_names}}))
    return directory


def np_layer_norm(x: np.ndarray, p: dict, eps: float = 1e-12) -> np.ndarray:
    """LayerNorm in numpy over the last axis, with a flax LayerNorm's `scale` and `bias`: the references' norm."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def np_gelu(x: np.ndarray) -> np.ndarray:
    """The exact (erf) GELU in numpy, BERT's."""
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def combined_runs(combine_main, root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """(source, target, combined): the runs `root/source` and `root/target` made one encoder-decoder
    by a family's combine command (GPT2GPT's, LSTM2LSTM's) into `root/combined`."""
    source, target, out = root / "source", root / "target", root / "combined"
    assert combine_main(["--source", str(source), "--target", str(target), "--to", str(out)]) == 0
    return source, target, out


def embedded_seq2seq_rows(run: pathlib.Path, n: int, source_length: int, target_length: int) -> dict[str, np.ndarray]:
    """Seq2seq rows of `n` validation examples of the embedded task in `run`'s vocabulary, the
    decoder starting at EOS (the combined runs' start token)."""
    from bertology import tasks
    from bertology.data.tokenizers import for_data
    from bertology.train.checkpoint import load_params
    from bertology.train.finetune import seq2seq_arrays

    tokenizer = for_data(load_params(run)[1]["data"])
    examples = tasks.get("seq2seq_embedded").load(None, log=lambda _: None)["validation"][:n]
    return seq2seq_arrays(examples, tokenizer, source_length, target_length, tokenizer.eos_id)


def roberta_fine_tuning_run(workdir: pathlib.Path) -> tuple[nn.Module, dict, dict[str, np.ndarray], dict]:
    """A tiny RoBERTa (16 positions) written at `workdir` as an sst2 fine-tuning run, the start of
    the long models' conversions (longify, BigBird's warm start): (its model, its params, a batch of
    two 12-token rows, the second padded after 9, and the head the run holds beside the trunk)."""
    from bertology.interop.hf import write_run as write_converted_run

    rc = config("roberta", "tiny")
    rc.model.update(vocab_size=60, num_layers=2, hidden_size=32, num_heads=4, intermediate_size=48,
                    max_position_embeddings=2 + 16)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 60, (2, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    batch = dict(input_ids=ids, input_mask=mask, masked_positions=np.broadcast_to(np.arange(12, dtype=np.int32), (2, 12)))
    roberta = models.build(rc.model)
    params = jax.tree.map(np.asarray, nn.meta.unbox(jax.jit(roberta.init)(jax.random.key(0), batch)["params"]))
    head = {"kernel": rng.normal(size=(32, 3)).astype(np.float32)}
    write_converted_run(workdir, rc.model.to_dict(), {**params, "head": head}, task="sst2")
    return roberta, params, batch, head


# --- encoder parity with transformers (test_deberta, test_megatron_bert, test_modernbert, test_longformer, test_bigbird)

# Our batch's arrays as transformers' encoders name them.
HF_INPUTS = {"input_ids": "input_ids", "input_mask": "attention_mask", "segment_ids": "token_type_ids",
             "global_attention_mask": "global_attention_mask"}


def hf_outputs(model, batch: dict, inputs: tuple[str, ...] = ("input_ids", "input_mask"),
               heads: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """A transformers encoder's hidden states (`hidden_0` the embeddings, then each layer's output,
    cut to the batch's length where HF pads a row inside) and its heads' logits (`heads`: our name
    → the output's attribute; MLM's `logits` by default), as numpy. `inputs`: the batch's arrays it
    reads (those of `inputs` the batch lacks are left out)."""
    import torch

    with torch.no_grad():
        o = model(**{HF_INPUTS[k]: torch.tensor(batch[k], dtype=torch.long) for k in inputs if k in batch},
                  output_hidden_states=True)
    length = batch["input_ids"].shape[1]
    out = {f"hidden_{i}": h[:, :length] for i, h in enumerate(o.hidden_states)}
    return {k: v.numpy() for k, v in {**out, **{ours: getattr(o, theirs)
                                                for ours, theirs in (heads or {"mlm": "logits"}).items()}}.items()}


def our_outputs(family: str, params: dict, block: dict, batch: dict, cfg=None,
                heads: tuple[str, ...] = ("mlm",)) -> dict[str, np.ndarray]:
    """Every hidden state (the trunk as fine-tuning builds it) and the pretraining heads' logits
    (`heads`: `mlm` for `mlm_logits`, ...), as numpy; `cfg`: the same parameters under another core
    config."""
    from bertology.models import tasks

    cfg = cfg or models.encoder_config(block)
    record = models.family(family)
    layers = tasks.trunk(cfg, family).apply({"params": record.trunk(params)}, batch)["layers"]
    res = record.model(cfg).apply({"params": params}, batch)
    out = {**{f"hidden_{i}": h for i, h in enumerate(layers)}, **{k: res[f"{k}_logits"] for k in heads}}
    return {k: np.asarray(v) for k, v in out.items()}
