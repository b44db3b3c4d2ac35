"""Fine-tune a pretrained (or freshly initialised) encoder on one downstream task, then score it.

The pretraining loop's pieces are reused as they are: `make_train_step` with the fine-tuning
loss, the mesh and logical-axis rules, the metrics writer, and `load_params` for the trunk of
any family's pretraining run. What is particular to fine-tuning lives here: epochs over a small
labelled set (10% warmup, linear decay, optional layer-wise decay), a trainable mask per mode,
prediction over padded evaluation batches, and the scores, results and submission files.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from ml_collections.config_dict import placeholder

from bertology import models, tasks
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.evaluation import outputs
from bertology.models.presets import bert_preset
from bertology.models.tasks import MODES, TaskModel
from bertology.objectives import finetune as objective
from bertology.tasks.inputs import Features, featurize, predict
from bertology.train import optimizer as optimizer_lib
from bertology.train import sharding
from bertology.train.checkpoint import load_params
from bertology.train.loop import fresh_state, make_train_step, param_init, resolve_vocab, write_config
from bertology.train.metrics import MetricsWriter, log

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


def default_config(task: str) -> ml_collections.ConfigDict:
    """The recipe every configs/finetune file starts from (BERT's: AdamW, 10% warmup, linear decay)."""
    c = ml_collections.ConfigDict()
    c.task = task
    c.init_checkpoint = placeholder(str)  # a pretraining --workdir; None: random init from `model`
    c.mode = "full"  # full | adapters | features
    c.adapter_size = 64
    c.seed = 0
    c.epochs = 3
    c.total_steps = placeholder(int)  # None: epochs over the training set
    c.batch_size = 32
    c.eval_batch_size = 64
    c.log_every = 20
    c.eval_every = 0  # steps between evaluations; 0: only at the end
    # Used only without init_checkpoint (a checkpoint brings its own model config).
    c.model = ml_collections.ConfigDict(dict(
        family="bert", vocab_size=placeholder(int), max_position_embeddings=512, dropout_rate=0.1,
        attention_dropout_rate=0.1, **bert_preset("tiny"),
    ))
    c.data = ml_collections.ConfigDict(dict(
        dir=placeholder(str),  # the task's files; None: data/<task default> under the working directory
        vocab=placeholder(str),  # without init_checkpoint; None: the shipped 8k WordPiece
        cache_dir=placeholder(str),
        max_seq_length=128,
        doc_stride=128,  # QA windows
        max_query_length=64,
        n_best_size=20,
        max_answer_length=30,
        null_score_threshold=0.0,  # SQuAD 2.0: answer "" when null score - best span > this
    ))
    c.optimizer = ml_collections.ConfigDict(dict(
        name="adamw", learning_rate=5e-5, warmup_fraction=0.1, warmup_steps=placeholder(int),
        b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
        layerwise_lr_decay=1.0,  # ELECTRA uses 0.8 (0.9 for large); 1.0 turns it off
    ))
    c.mesh = sharding.mesh_config()
    return c


def merge_pretrained(fresh: Any, pretrained: Any, where: str) -> Any:
    """`fresh` encoder params with every tensor the checkpoint has replaced by its value.

    Adapters are new, so they keep their initialisation; any other missing tensor or any shape
    mismatch means the checkpoint is not this encoder.
    """
    saved = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(pretrained)}

    def pick(path, leaf):
        name = jax.tree_util.keystr(path)
        if name not in saved:
            if "adapter" in name:
                return leaf
            raise UserError(f"checkpoint {where} has no encoder tensor {name}; it is not a bertology pretraining run")
        if tuple(saved[name].shape) != tuple(leaf.shape):
            raise UserError(f"checkpoint {where}: encoder tensor {name} has shape {saved[name].shape}, expected {leaf.shape}")
        return jnp.asarray(saved[name], leaf.dtype)

    return jax.tree_util.tree_map_with_path(pick, fresh)


def trainable_mask(params: Any, mode: str) -> Any:
    """Which parameters train: all (full); adapters, LayerNorms and non-encoder parameters
    (adapters); everything outside the encoder (features)."""

    def trains(path, _):
        names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
        if mode == "full" or names[0] != "encoder":
            return True
        return mode == "adapters" and ("adapter" in names or "norm" in names)

    return jax.tree_util.tree_map_with_path(trains, params)


def _encoder(config: ml_collections.ConfigDict) -> tuple[models.TransformerConfig, Any, Any, str]:
    """(encoder config, pretrained encoder params or None, tokenizer, vocab path)."""
    if config.init_checkpoint:
        params, pre = load_params(config.init_checkpoint)
        cfg, encoder = models.pretrained_encoder(params, pre["model"])
        vocab = pre["data"].get("vocab") or str(DEFAULT_VOCAB)
        return cfg, encoder, load_tokenizer(vocab), vocab
    vocab, tokenizer = resolve_vocab(config)
    return models.encoder_config(config.model), None, tokenizer, str(vocab)


def _batches(n: int, batch_size: int, rng: np.random.Generator):
    """Endless full batches of row indices, reshuffled every pass (wrapping around small sets)."""
    pool = np.zeros(0, np.int64)
    while True:
        while len(pool) < batch_size:
            pool = np.concatenate([pool, rng.permutation(n)])
        yield pool[:batch_size]
        pool = pool[batch_size:]


def finetune(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Fine-tune per `config`, write results.json (and predictions) to `workdir`; return the results."""
    workdir = pathlib.Path(workdir)
    config = ml_collections.ConfigDict(config.to_dict())
    task = tasks.get(config.task)
    if config.mode not in MODES:
        raise UserError(f"mode={config.mode!r} is unknown; use one of {MODES}")
    cfg, pretrained, tokenizer, vocab = _encoder(config)
    config.data.vocab = vocab
    if config.mode == "adapters":
        cfg = dataclasses.replace(cfg, adapter_size=config.adapter_size)
    if config.data.max_seq_length > cfg.max_position_embeddings - cfg.position_offset:
        raise UserError(f"data.max_seq_length={config.data.max_seq_length} exceeds the encoder's "
                        f"{cfg.max_position_embeddings - cfg.position_offset} positions; lower it")
    write_config(config, workdir)

    splits = task.load(config.data.dir, config.data.cache_dir, log=log)
    if not splits.get("train"):
        raise UserError(f"task {task.name} has no training examples; check its files under data.dir")
    feats = {s: featurize(task, splits[s], tokenizer, config.data) for s in splits}
    if cfg.type_vocab_size == 1:  # RoBERTa has one segment embedding: pairs are told apart by [SEP] alone
        for f in feats.values():
            f.arrays["segment_ids"] = np.zeros_like(f.arrays["segment_ids"])
    train_arrays = feats["train"].arrays
    n_train = len(train_arrays["input_ids"])
    total = config.total_steps or config.epochs * math.ceil(n_train / config.batch_size)
    opt_cfg = ml_collections.ConfigDict(config.optimizer.to_dict())
    if opt_cfg.warmup_steps is None:
        opt_cfg.warmup_steps = int(round(opt_cfg.warmup_fraction * total))

    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.rules_for(config.mesh)
    data_size = sharding.batch_devices(mesh, rules)
    for key in ("batch_size", "eval_batch_size"):
        if config[key] % data_size:
            raise UserError(f"{key}={config[key]} is not divisible by the {data_size} data-parallel devices; change it or mesh.shape")

    model = TaskModel(cfg, task.kind, task.num_labels, config.mode)
    example = {k: v[:1] for k, v in train_arrays.items() if k in MODEL_INPUTS}
    key = jax.random.key(config.seed)

    init_boxed = param_init(model, example)
    with sharding.activate(mesh, rules):
        param_shardings = sharding.logical_shardings(jax.eval_shape(init_boxed, key), mesh, rules)
        params = jax.jit(lambda k: nn.meta.unbox(init_boxed(k)), out_shardings=param_shardings)(key)
        if pretrained is not None:
            params = {**params, "encoder": merge_pretrained(params["encoder"], pretrained, config.init_checkpoint)}
            params = jax.device_put(params, param_shardings)
        decay = config.optimizer.layerwise_lr_decay
        tx, lr = optimizer_lib.make(
            opt_cfg, total,
            trainable=trainable_mask(params, config.mode) if config.mode != "full" else None,
            multipliers=optimizer_lib.layerwise_multipliers(params, cfg.num_layers, decay) if decay != 1.0 else None,
        )
        state = fresh_state(params, tx)
        train_step = jax.jit(make_train_step(model, objective.loss, tx, lr, 1), donate_argnums=(0,))
        apply = jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True))

        def evaluate(params) -> dict[str, Any]:
            scores, preds = {}, {}
            for split in [*task.eval_splits, *(s for s, _ in task.submissions if s in feats)]:
                out = _outputs(apply, params, feats[split], config.eval_batch_size, mesh, rules)
                preds[split] = predict(task, splits[split], feats[split], out, config.data)
                if split in task.eval_splits:
                    prefix = "" if len(task.eval_splits) == 1 else f"{split}_"
                    scores.update({prefix + k: v for k, v in task.score(splits[split], preds[split]).items()})
            return {"scores": scores, "predictions": preds}

        writer = MetricsWriter(workdir)
        n_params = sum(x.size for x in jax.tree.leaves(params))
        n_train_params = sum(x.size for x, t in zip(jax.tree.leaves(params), jax.tree.leaves(trainable_mask(params, config.mode))) if t)
        log(f"fine-tuning {task.name} ({task.kind}, mode {config.mode}, {n_train_params / 1e6:.2f}M of "
            f"{n_params / 1e6:.2f}M params trained) from {config.init_checkpoint or 'scratch'}: "
            f"{n_train} training rows, {total} steps of {config.batch_size}")
        history, evals = [], []
        batches = _batches(n_train, config.batch_size, np.random.default_rng(config.seed))
        t0 = time.time()
        for step in range(1, total + 1):
            rows = next(batches)
            batch = sharding.shard_batch({k: v[rows] for k, v in train_arrays.items() if k != "word_index"}, mesh, rules)
            state, metrics = train_step(state, batch, key)
            if step % config.log_every == 0 or step == total:
                m = {k: float(v) for k, v in jax.device_get(metrics).items()}
                writer.write(step, m)
                history.append({"step": step, **m})
                log(f"step {step}/{total} | loss {m['loss']:.4f} | lr {m['learning_rate']:.2e} | {time.time() - t0:.0f}s")
            if step == total or (config.eval_every and step % config.eval_every == 0):
                result = evaluate(state["params"])
                writer.write(step, result["scores"], prefix="eval_")
                evals.append({"step": step, **result["scores"]})
                log(f"eval @ {step}: " + " | ".join(f"{k} {v:.2f}" for k, v in result["scores"].items()))
        writer.close()

    results = {
        "task": task.name, "kind": task.kind, "mode": config.mode, "init_checkpoint": config.init_checkpoint,
        "steps": total, "scores": result["scores"], "primary": task.primary, "evals": evals,
        "train_loss": [h["loss"] for h in history], "seconds": time.time() - t0,
    }
    outputs.write_results(workdir, results)
    _write_predictions(task, splits, result["predictions"], workdir)
    return {**results, "params": state["params"], "predictions": result["predictions"]}


def _outputs(apply, params, features: Features, batch_size: int, mesh, rules) -> dict[str, np.ndarray]:
    """The model's outputs for every row, in fixed-size batches (the last padded, then trimmed)."""
    arrays = {k: v for k, v in features.arrays.items() if k in MODEL_INPUTS}
    n = len(arrays["input_ids"])
    chunks = []
    for start in range(0, n, batch_size):
        rows = np.arange(start, start + batch_size) % n  # wrap to fill the last batch
        out = apply(params, sharding.shard_batch({k: v[rows] for k, v in arrays.items()}, mesh, rules))
        chunks.append({k: np.asarray(v)[: min(batch_size, n - start)] for k, v in jax.device_get(out).items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def _write_predictions(task: tasks.Task, splits: dict, predictions: dict, workdir: pathlib.Path) -> None:
    """Leaderboard files: GLUE TSVs for the test splits present, SQuAD JSON for every QA split."""
    for split, name in task.submissions:
        if split in predictions:
            preds = [float(p) if task.kind == "regression" else task.labels[int(p)] for p in predictions[split]]
            outputs.write_glue_tsv(workdir / "submission" / name, [e["idx"] for e in splits[split]], preds)
    if task.kind == "qa":
        for split, preds in predictions.items():
            outputs.write_squad_json(workdir / f"predictions_{split}.json", preds)
