"""Fine-tune a pretrained (or freshly initialised) encoder on one downstream task, then score it.

The run itself is pretraining's (`bertology.train.run`: mesh and rules, state, jitted step with
the `finetune` objective, checkpoints with exact resume, SIGTERM, metrics), and `load_params`
takes the trunk of any family's pretraining run. What is particular to fine-tuning lives here:
epochs over a small labelled set (10% warmup, linear decay, optional layer-wise decay), a
trainable mask per mode, prediction over padded evaluation batches, and the scores, results and
submission files.

Options that make a smaller model while fine-tuning (each a config key, all combinable):
- `teacher_checkpoint`: a fine-tuning run on the same task whose predictions the student learns
  (TinyBERT's prediction-layer distillation, soft cross-entropy at `distill_temperature`;
  `bertology.families.tinybert.objective`) instead of the labels;
- `quantize="int8"`: Q8BERT's quantization-aware training (`bertology.train.quantize`); the run
  also writes `int8_params.msgpack`, the int8 weights for int8 inference;
- `prune.kind`: magnitude (Zhu & Gupta) or head (Michel et al.) pruning on a schedule over
  `prune.begin_fraction`..`prune.end_fraction` of the steps (`bertology.train.prune`).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Callable

import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from ml_collections.config_dict import placeholder

from bertology import models, objectives, tasks, validation
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.rows import ShuffledRows
from bertology.data.tokenizers import for_data
from bertology.data.transforms import seq2seq_rows
from bertology.errors import UserError
from bertology.evaluation import outputs
from bertology.files import atomic_write
from bertology.generation import decoder_start_id, frame_source, generate
from bertology.models import layout, task_encoders
from bertology.models.decoding import decoding_of, require
from bertology.models.presets import bert_preset
from bertology.models.tasks import MODES, TaskModel, check_fine_tunable, check_language_model, check_length, input_keys
from bertology.models.tasks import trunk as trunk_network
from bertology.tasks import kinds
from bertology.tasks.kinds import Features, featurize, predict
from bertology.train import optimizer as optimizer_lib
from bertology.train import prune as prune_lib
from bertology.train import quantize as quantize_lib
from bertology.train import run as run_lib
from bertology.train import sharding
from bertology.train.checkpoint import check_shapes, load_params
from bertology.train.metrics import log
from bertology.train.teacher import Teacher
from bertology.train.trackers import logging_config


def run_settings() -> dict[str, Any]:
    """The `model` keys of how a fine-tuning run computes and regularises its network
    (`models.RUN_KEYS`: model.dtype, attention_backend, remat, norm_backward and the dropout
    rates), unset: a fine-tuning config may start from a run of any family, so each keeps the
    checkpoint's value (without one, the network's default) unless the command line sets it, e.g.
    on a GPU `--config.model.dtype=bfloat16 --config.model.attention_backend=cudnn
    --config.model.attention_dropout_rate=0`."""
    return {key: placeholder(float if key.endswith("dropout_rate") else str) for key in models.RUN_KEYS}


def default_config(task: str) -> ml_collections.ConfigDict:
    """The recipe every configs/finetune file starts from (BERT's: AdamW, 10% warmup, linear decay)."""
    c = ml_collections.ConfigDict()
    c.task = task
    c.init_checkpoint = placeholder(str)  # a pretraining or fine-tuning --workdir; None: random init
    c.mode = "full"  # full | adapters | features
    c.adapter_size = 64
    c.seed = 0
    c.epochs = 3
    c.total_steps = placeholder(int)  # None: epochs over the training set
    c.batch_size = 32
    c.grad_accum_steps = 1  # microbatches per step (exact: the full batch's gradient)
    c.eval_batch_size = 64
    c.log_every = 20
    c.logging = logging_config()  # W&B and trackio beside metrics.jsonl and TensorBoard (train/trackers.py)
    c.eval_every = 0  # steps between evaluations; 0: only at the end
    c.checkpoint_every = 1000  # and at the last step; a rerun in the same workdir resumes
    c.checkpoint_every_minutes = 0.0  # and after this many minutes (0: off)
    c.keep_checkpoints = 2
    c.max_nonfinite_steps = 5  # NaN/inf steps in a row (each skipped, not applied) before a run stops
    c.allow_config_change = ""  # comma-separated keys a resumed run may change, e.g. total_steps,optimizer.learning_rate
    # The network, used only without init_checkpoint (a checkpoint brings its own); how the run computes
    # and regularises it, either way (`run_settings`).
    c.model = ml_collections.ConfigDict(dict(
        family="bert", vocab_size=placeholder(int), max_position_embeddings=512, **bert_preset("tiny"),
        **run_settings(),
    ))
    c.data = ml_collections.ConfigDict(dict(
        dir=placeholder(str),  # the task's files; None: data/<task default> under the working directory
        vocab=placeholder(str),  # None: the checkpoint's, else the shipped 8k WordPiece; its size must be the model's
        cache_dir=placeholder(str),
        max_seq_length=128,
        doc_stride=128,  # QA windows
        max_query_length=64,
        n_best_size=20,
        max_answer_length=30,
        null_score_threshold=0.0,  # SQuAD 2.0: answer "" when null score - best span > this
        max_skipped_fraction=placeholder(float),  # GLUE: the share of a file's rows it may skip; None: 1% (QQP: all)
        # a sentence pair read in both orders, the two final states added before the head (GPT-1's similarity
        # tasks, Radford et al. 2018 §3.3: a causal trunk has no natural order for a symmetric relation)
        both_orders=False,
        # Tasks from your own files (text_classification, text_regression, token_tagging; `tasks.custom`):
        files=ml_collections.ConfigDict(dict(train=placeholder(str), validation=placeholder(str), test=placeholder(str))),
        columns=ml_collections.ConfigDict(dict(text="text", pair=placeholder(str), label="label", tag=-1)),
        labels=placeholder(str),  # "a,b,c" in order; None: the training file's, sorted
    ))
    c.optimizer = ml_collections.ConfigDict(dict(
        name="adamw", learning_rate=5e-5, warmup_fraction=0.1, warmup_steps=placeholder(int),
        b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
        layerwise_lr_decay=1.0,  # ELECTRA uses 0.8 (0.9 for large); 1.0 turns it off
        schedule="linear",  # linear | cosine | slanted_triangular (ULMFiT: from and back to 1/stlr_ratio of the peak)
        stlr_ratio=32.0,
    ))
    # ULMFiT's gradual unfreezing: the top layer group (task head) trains alone, then one more group, top down,
    # every this many epochs (Howard & Ruder 2018: 1); 0: every layer trains from the start
    c.unfreeze_every_epochs = 0.0
    # A BiLSTM task model between the trunk and the head (`models/task_encoders.py`): GLUE's baselines (Wang et
    # al. 2018) over ELMo's scalar mix, with mode=features. name: none | bilstm | bilstm_attn
    c.task_encoder = ml_collections.ConfigDict(dict(name="none", hidden_size=256, num_layers=1,
                                                    classifier_hidden_size=256, dropout_rate=0.0))
    c.mesh = sharding.mesh_config()
    # Smaller models (module docstring): distillation from a fine-tuned teacher, int8 QAT, pruning.
    # GPT's auxiliary language-modelling loss during fine-tuning, L = L_task + lm_weight · L_LM (Radford et al.
    # 2018: 0.5); a causal trunk only (a GPT run's)
    c.lm_weight = 0.0
    c.teacher_checkpoint = placeholder(str)  # a fine-tuning run on the same task; None: learn the labels
    c.distill_temperature = 1.0
    c.quantize = "none"  # none | int8
    c.quant_ema_decay = 0.9999  # the activation ranges' moving average (Q8BERT's)
    c.prune = ml_collections.ConfigDict(dict(
        kind="none",  # none | magnitude | heads
        sparsity=0.0,  # final fraction of the encoder layers' weights (magnitude) or of all heads (heads)
        scope="global",  # magnitude: global | per_matrix
        begin_fraction=0.0, end_fraction=0.5,  # the cubic schedule's span, as fractions of the steps
        every=10,  # steps between mask updates
    ))
    return c


# What fine-tuning adds to a pretrained trunk, so it keeps its initialisation: adapters, activation ranges, and a
# trunk's sequence-summary projection that pretraining never trains (`task_trunk`: XLNet's, HF's SequenceSummary).
NEW_IN_FINETUNING = ("adapter", quantize_lib.RANGE, "summary")


def merge_pretrained(fresh: Any, pretrained: Any, where: str) -> Any:
    """`fresh` encoder params with every tensor the checkpoint has replaced by its value.

    What fine-tuning adds (`NEW_IN_FINETUNING`) keeps its initialisation; any other missing tensor or any shape
    mismatch means the checkpoint is not this encoder.
    """
    saved = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(pretrained)}

    def pick(path, leaf):
        name = jax.tree_util.keystr(path)
        if name not in saved:
            if any(new in name for new in NEW_IN_FINETUNING):
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


def _encoder(config: ml_collections.ConfigDict) -> tuple[Any, dict[str, Any] | None, Any, str, str, dict[str, Any]]:
    """(trunk config, the parameters a run starts from or None (`encoder`: the pretrained trunk;
    from a fine-tuning run also what it trained for this run's tasks, `start_from_tasks`), tokenizer,
    vocab path, the trunk's family, whose optional `task_trunk` and `task_inputs` hooks build the
    trunk and add its inputs, and the model block the trunk is built from).

    With init_checkpoint the vocabulary is `data.vocab` if set, else the checkpoint's own; either
    way its size must be the checkpoint's embedding rows, or every id would look up another
    token's (or, past the table, a clamped) embedding without a word."""
    if config.init_checkpoint:
        params, pre = load_params(config.init_checkpoint)
        block = models.run_block(config.model, pre["model"])  # what it is; how this run computes it
        if encoder_fine_tuning_run(pre):  # its trunk is fine-tuning's, its config.json's model block built it
            cfg, start = models.encoder_config(block), start_from_tasks(params, pre, config)
        else:
            cfg, encoder = models.pretrained_encoder(params, block)
            start = {"encoder": encoder}
        vocab = config.data.vocab or pre["data"].get("vocab") or str(DEFAULT_VOCAB)
        tokenizer = for_data({**pre["data"], "vocab": vocab})  # with the tokens pretraining added (T5's sentinels)
        if tokenizer.vocab_size != cfg.vocab_size:
            source = "data.vocab" if config.data.vocab else "its vocabulary"
            raise UserError(f"{source} {vocab} has {tokenizer.vocab_size} tokens but init_checkpoint "
                            f"{config.init_checkpoint} embeds {cfg.vocab_size}; set data.vocab to the vocabulary it "
                            "was trained with")
        return cfg, start, tokenizer, vocab, block["family"], block
    vocab, tokenizer = run_lib.resolve_vocab(config)
    block = models.run_block(config.model)
    cfg = models.encoder_config(block)
    # what config.json records: the unset settings as the network resolved them (the dropout rates were
    # always recorded; a run resumed across this version would otherwise see them vanish as drift)
    fields = {f.name for f in dataclasses.fields(cfg)}
    block.update({k: getattr(cfg, k) for k in models.RUN_KEYS if k not in block and k in fields})
    return cfg, None, tokenizer, str(vocab), block["family"], block


def encoder_fine_tuning_run(pre: dict[str, Any]) -> bool:
    """Whether run config `pre` is an encoder fine-tuning run's (single- or multi-task), whose
    parameters are fine-tuning's trunk and heads; a seq2seq fine-tuning run's (CoVe's MT-LSTM, a
    summariser) are its family's whole model, read as a pretraining run's."""
    return bool(pre.get("tasks")) or (bool(pre.get("task")) and tasks.MODULES.get(pre["task"]) != "seq2seq")


def start_from_tasks(params: dict[str, Any], pre: dict[str, Any], config: ml_collections.ConfigDict) -> dict[str, Any]:
    """What a run starts from in the `params` of a fine-tuning run with config dict `pre`: its trunk,
    and the heads of the tasks both runs train. From a single-task run, everything beside its trunk
    (its `head`, and a scalar `mix` or task encoder where it had them) when this run fine-tunes
    that task alone (continued fine-tuning: the second stage of a curriculum,
    configs/finetune/long_range.py); from a multi-task run (`bertology.train.multitask`), each
    task's head (mix, PALs) under the name this run gives it: a single-task run of one of its tasks
    takes `head_<task>` as its `head` (as MT-DNN's last stage), a multi-task run the same names
    for the tasks it shares."""
    shared = set(config.get("tasks") or ())
    start = {"encoder": params["encoder"]}
    if not pre.get("tasks"):
        if not shared and pre["task"] == config.task:
            start.update((part, value) for part, value in params.items() if part != "encoder")
        return start
    for key, value in params.items():
        part, _, task = key.partition("_")
        if task in shared:
            start[key] = value
        elif not shared and task == config.task:
            start[part] = value
    return start


def start_from(fresh: dict[str, Any], start: dict[str, Any], where: str) -> dict[str, Any]:
    """`fresh` parameters with what the checkpoint `where` gives (`_encoder`'s start): the encoder
    merged (`merge_pretrained`), every other part the fresh model has taken whole (its shapes
    checked: a task's head with another label set is refused)."""
    params = dict(fresh)
    for name, saved in start.items():
        if name == "encoder":
            params[name] = merge_pretrained(fresh[name], saved, where)
        elif name in fresh:
            check_shapes(saved, fresh[name], pathlib.Path(where))
            params[name] = jax.tree.map(lambda s, f: jnp.asarray(s, f.dtype), saved, fresh[name])
            log(f"starting {name} from {where}")
    return params


@dataclasses.dataclass
class Job:
    """What a task kind's set-up hands the one driver (`finetune`): the resolved config (the vocabulary
    filled in, validated, frozen), the network and its loss, the training rows, the optimizer,
    where the start comes from, how to evaluate within the run, and what to write at the end."""

    config: ml_collections.FrozenConfigDict
    task: str  # what results.json names the run: its task, or its tasks joined by "+"
    kind: str  # the task kind (`kinds`), "seq2seq" or "multitask"
    primary: str  # the score that summarises the run
    model: Any
    objective: objectives.Objective
    rows: Any  # the training batches (`ShuffledRows`, or a family's own)
    example: dict[str, np.ndarray]  # one row: the shapes the state is initialised with
    n_train: int
    total: int
    optimizer: Callable[[Any], Any]  # params -> (transformation, learning-rate schedule)
    start_params: Callable[[Any], Any] | None  # fresh params -> the starting ones (the pretrained trunk)
    evaluator: Callable[[run_lib.Run], Callable[[Any], dict[str, Any]]]  # run -> params -> {scores, predictions}
    finish: Callable[[Any, dict[str, Any], pathlib.Path], dict[str, Any]]  # (params, predictions, workdir) -> results
    described: Callable[[Any], str]  # params -> what the log's first line says the run trains
    teacher: Teacher | None = None


def finetune(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Fine-tune per `config` in `workdir`, resuming from its latest checkpoint; write results.json
    (and predictions) and return the results. A run stopped by SIGTERM returns {"preempted": True, ...}.

    Every task kind runs this one loop; what differs is its `Job`: an encoder with a head
    (`encoder_job`, the kinds of `bertology.tasks.kinds`), a whole seq2seq model (`_seq2seq_job`),
    or one encoder with a head per task of `config.tasks` (`bertology.train.multitask`)."""
    workdir = pathlib.Path(workdir)
    job = _job(ml_collections.ConfigDict(config.to_dict()))
    config = job.config
    t0 = time.time()
    with run_lib.setup(config, workdir, model=job.model, objective=job.objective, example=job.example,
                       optimizer=job.optimizer, start_params=job.start_params, teacher=job.teacher) as run:
        evaluate = job.evaluator(run)
        latest: dict[str, Any] = {}

        def scores(params) -> dict[str, float]:
            latest.update(evaluate(params))
            return latest["scores"]

        log(f"fine-tuning {job.task} ({job.described(run.state['params'])}) from "
            f"{config.init_checkpoint or 'scratch'}: {job.n_train} training rows, {job.total} steps of {config.batch_size}")
        results = _results(run, run.fit(job.rows, job.total, scores), job, latest, evaluate, workdir, t0)
    if results.get("preempted"):
        return results
    results = {**results, **job.finish(run.state["params"], latest["predictions"], workdir)}
    outputs.write_results(workdir, results)
    return {**results, "params": run.state["params"], "predictions": latest["predictions"]}


def _job(config: ml_collections.ConfigDict) -> Job:
    """The job of `config`: several tasks (`tasks`), else its one task's, by kind."""
    if config.get("tasks"):
        from bertology.train import multitask  # built on this module's pieces

        return multitask.job(config)
    task = tasks.get(config.task, config.data)
    return (_seq2seq_job if task.kind == "seq2seq" else encoder_job)(config, task)


def _training_splits(data: ml_collections.ConfigDict, task: tasks.Task) -> dict[str, list[tasks.Example]]:
    """The task's splits read from the files its `data` block names; one without training rows is refused."""
    options = {k: data[k] for k in task.options if data.get(k) is not None}
    splits = task.load(data.dir, data.cache_dir, log=log, **options)
    if not splits.get("train"):
        raise UserError(f"task {task.name} has no training examples; check its files under data.dir")
    return splits


@dataclasses.dataclass
class Trunk:
    """The encoder an encoder job fine-tunes (`encoder_trunk`): its config, family and the family's
    record, the tokenizer, the model block it is built from, and what it starts from (`_encoder`'s
    start: the checkpoint's parameters by name; None: a random start)."""

    cfg: Any
    family: str
    record: models.Family
    tokenizer: Any
    block: dict[str, Any]
    start: dict[str, Any] | None


def encoder_trunk(config: ml_collections.ConfigDict) -> Trunk:
    """The trunk of `config` (pretrained, or fresh from `model`), the vocabulary filled in and the
    config validated, with what its mode and options need checked; `config.model` becomes the
    trunk's model block."""
    if config.mode not in MODES:
        raise UserError(f"mode={config.mode!r} is unknown; use one of {MODES}")
    cfg, start, tokenizer, vocab, family, block = _encoder(config)
    record = models.family(family)
    config.data.vocab = vocab
    validation.check(config)
    check_fine_tunable(family)
    modes = record.task_modes
    if config.mode not in modes:
        raise UserError(f"the {family} trunk fine-tunes with mode {' or '.join(modes)}, not {config.mode}; "
                        f"set mode={modes[0]}")
    if config.mode == "adapters":
        cfg = dataclasses.replace(cfg, adapter_size=config.adapter_size)
    # A trunk that is not a Transformer (ELMo's, the LSTM baselines') has no layer count or position table:
    # each is asked of the trunk's config, not of the family's name.
    if config.optimizer.layerwise_lr_decay != 1.0 and not hasattr(cfg, "num_layers"):
        raise UserError(f"optimizer.layerwise_lr_decay needs a layered Transformer trunk, not {family}'s; set it to 1.0")
    if config.unfreeze_every_epochs and not hasattr(cfg, "num_layers"):
        raise UserError(f"unfreeze_every_epochs needs a layered Transformer trunk, not {family}'s; set it to 0")
    if config.unfreeze_every_epochs and config.mode != "full":
        raise UserError(f"unfreeze_every_epochs thaws the whole trunk layer by layer; mode={config.mode!r} keeps part of "
                        "it frozen throughout: set mode='full' or unfreeze_every_epochs=0")
    check_length(cfg, config.data.max_seq_length, "data.max_seq_length")
    # what config.json records: the block this trunk is built from (a checkpoint's, not the config file's
    # unused one), so a run started from this one (continued fine-tuning, a teacher) rebuilds it
    config.model = ml_collections.ConfigDict(block)
    return Trunk(cfg, family, record, tokenizer, block, start)


def task_features(trunk: Trunk, task: tasks.Task,
                  data: ml_collections.ConfigDict) -> tuple[dict[str, list[tasks.Example]], dict[str, Features]]:
    """(splits, the trunk's rows of each split) of `task`, read and encoded per its `data` block."""
    splits = _training_splits(data, task)
    feats = {s: featurize(task, splits[s], trunk.tokenizer, data) for s in splits}
    if trunk.record.task_inputs is not None:  # what the family's trunk reads beyond the ids (ELMo's characters, ...)
        for f in feats.values():
            f.arrays.update(trunk.record.task_inputs(trunk.cfg, trunk.tokenizer, f.arrays, task.kind))
    if one_segment(trunk.cfg):
        for f in feats.values():
            f.arrays["segment_ids"] = np.zeros_like(f.arrays["segment_ids"])
    return splits, feats


def one_segment(cfg: Any) -> bool:
    """Whether the trunk has one segment embedding (RoBERTa's): its task rows' segment ids are
    zeroed (`task_features`), and a pair's sentences are told apart by [SEP] alone."""
    return getattr(cfg, "type_vocab_size", None) == 1


def training_rows(feats: dict[str, Features]) -> dict[str, np.ndarray]:
    """The arrays a training batch takes from the training split's rows (not tagging's word index)."""
    return {k: v for k, v in feats["train"].arrays.items() if k != "word_index"}


def encoder_optimizer(config: ml_collections.ConfigDict, trunk: Trunk, opt_cfg: ml_collections.ConfigDict, total: int,
                      n_train: int, plan: prune_lib.Plan) -> Callable[[Any], tuple[Any, Any]]:
    """params -> (transformation, schedule) of an encoder job: frozen parts per mode, ELECTRA's
    layer-wise rates, ULMFiT's gradual unfreezing, Q8BERT's ranges and the pruning plan, as set."""

    def optimizer(params: Any) -> tuple[Any, Any]:
        cfg, record = trunk.cfg, trunk.record
        decay = config.optimizer.layerwise_lr_decay
        every = max(1, round(config.unfreeze_every_epochs * n_train / config.batch_size))
        tx, lr = optimizer_lib.make(
            opt_cfg, total,
            trainable=trainable_mask(params, config.mode) if config.mode != "full" else None,
            multipliers=(optimizer_lib.layerwise_multipliers(params, cfg.num_layers, decay, record.layer_index)
                         if decay != 1.0 else None),
            unfreezing=((optimizer_lib.unfreezing_ranks(params, cfg.num_layers, record.layer_index), every)
                        if config.unfreeze_every_epochs else None),
        )
        if config.quantize == "int8":
            tx = quantize_lib.ema_ranges(tx, config.quant_ema_decay)
        return (tx if plan.kind == "none" else prune_lib.pruned(tx, plan, record.layer_index)), lr

    return optimizer


def task_scores(task: tasks.Task, splits: dict[str, list[tasks.Example]], feats: dict[str, Features],
                outputs: Callable[[Features], dict[str, np.ndarray]],
                data: ml_collections.ConfigDict) -> tuple[dict[str, float], dict[str, Any]]:
    """(scores, predictions) of one task: `outputs(features)` runs the model on every row of a
    split. Scored on its evaluation splits (each score prefixed by the split where it has several),
    predicted on those and on the submission splits present."""
    scores, preds = {}, {}
    for split in [*task.eval_splits, *(s for s, _ in task.submissions if s in feats)]:
        preds[split] = predict(task, splits[split], feats[split], outputs(feats[split]), data)
        if split in task.eval_splits:
            prefix = "" if len(task.eval_splits) == 1 else f"{split}_"
            scores.update({prefix + k: v for k, v in task.score(splits[split], preds[split]).items()})
    return scores, preds


def trained_share(params: Any, mode: str) -> str:
    """What the log's first line says of the parameters a run trains."""
    n_params = sum(x.size for x in jax.tree.leaves(params))
    trains = jax.tree.leaves(trainable_mask(params, mode))
    n_trained = sum(x.size for x, t in zip(jax.tree.leaves(params), trains) if t)
    return f"mode {mode}, {n_trained / 1e6:.2f}M of {n_params / 1e6:.2f}M params trained"


def encoder_job(config: ml_collections.ConfigDict, task: tasks.Task) -> Job:
    """An encoder (pretrained, or fresh from `model`) under the task kind's head."""
    trunk = encoder_trunk(config)
    splits, feats = task_features(trunk, task, config.data)
    train_arrays = feats["train"].arrays
    n_train = len(train_arrays["input_ids"])
    total, opt_cfg = steps_and_optimizer(config, n_train)
    plan = prune_plan(config, total)
    encoder = task_encoders.settings(config.task_encoder)
    if encoder is not None and one_segment(trunk.cfg) and not kinds.of(task.kind).per_token:
        raise UserError(f"task_encoder {config.task_encoder.name} tells a pair's sentences apart by their segment ids, "
                        "which a trunk with one segment embedding (RoBERTa's) reads as zeros; set task_encoder.name=none")
    model = task_model(trunk.cfg, trunk.family, task, config.mode, config.quantize, config.grad_accum_steps, encoder)
    teacher = task_teacher(config, task)
    if config.lm_weight:
        check_language_model(trunk_network(trunk.cfg, trunk.family), trunk.family)
    if teacher is not None and config.lm_weight:
        raise UserError("lm_weight > 0 with a teacher_checkpoint: distillation has no language-modelling term; "
                        "set lm_weight=0")
    objective = objectives.get({"name": "finetune", "lm_weight": config.lm_weight} if teacher is None else
                               {"name": "tinybert", "stage": "prediction", "temperature": config.distill_temperature})
    keys = input_keys(trunk.family)

    def evaluator(run: run_lib.Run) -> Callable[[Any], dict[str, Any]]:
        apply = jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True))

        def evaluate(params) -> dict[str, Any]:
            scores, preds = task_scores(task, splits, feats, lambda f: batched_outputs(
                apply, params, f, config.eval_batch_size, run.shard, keys), config.data)
            return {"scores": scores, "predictions": preds}
        return evaluate

    def finish(params: Any, predictions: dict[str, Any], workdir: pathlib.Path) -> dict[str, Any]:
        kinds.write(task, splits, predictions, workdir)
        return _compression(params, config, plan, trunk.record.layer_index, workdir)

    start = trunk.start
    return Job(config=ml_collections.FrozenConfigDict(config), task=task.name, kind=task.kind, primary=task.primary,
               model=model, objective=objective,
               rows=ShuffledRows(training_rows(feats), config.batch_size, config.seed),
               example={k: v[:1] for k, v in train_arrays.items() if k in keys}, n_train=n_train, total=total,
               optimizer=encoder_optimizer(config, trunk, opt_cfg, total, n_train, plan),
               start_params=None if start is None else (lambda fresh: start_from(fresh, start, config.init_checkpoint)),
               evaluator=evaluator, finish=finish,
               described=lambda params: f"{task.kind}, {trained_share(params, config.mode)}", teacher=teacher)


def steps_and_optimizer(config: ml_collections.ConfigDict, n_train: int) -> tuple[int, ml_collections.ConfigDict]:
    """The run's optimizer steps (`total_steps`, else `epochs` passes over `n_train` rows) and its
    optimizer block with the warm-up resolved (`warmup_steps`, else `warmup_fraction` of the steps)."""
    total = config.total_steps or config.epochs * math.ceil(n_train / config.batch_size)
    opt_cfg = ml_collections.ConfigDict(config.optimizer.to_dict())
    if opt_cfg.warmup_steps is None:
        opt_cfg.warmup_steps = int(round(opt_cfg.warmup_fraction * total))
    return total, opt_cfg


def task_model(cfg: Any, family: str, task: tasks.Task, mode: str, quantize: str,
               grad_accum_steps: int = 1, encoder: task_encoders.Settings | None = None) -> TaskModel:
    """The fine-tuning network of a `family` trunk (with a task `encoder` under its head, if any): a
    `TaskModel`, quantization-aware for `quantize="int8"`."""
    if quantize == "none":
        return TaskModel(cfg, task.kind, kinds.of(task.kind).width(task), mode, family, encoder)
    if encoder is not None:
        raise UserError("quantize='int8' quantizes the trunk's and head's dense layers, not a task encoder's LSTMs; "
                        "set task_encoder.name=none or quantize=none")
    if quantize != "int8":
        raise UserError(f"quantize={quantize!r} is unknown; use 'none' or 'int8'")
    if grad_accum_steps != 1:
        raise UserError("quantize='int8' measures activation ranges per step and cannot accumulate microbatches; "
                        "set grad_accum_steps=1")
    return quantize_lib.QuantizedTaskModel(cfg, task.kind, kinds.of(task.kind).width(task), mode, family)


def task_teacher(config: ml_collections.ConfigDict, task: tasks.Task) -> Teacher | None:
    """The fine-tuned teacher of prediction-layer distillation (`teacher_checkpoint`), or None."""
    if not config.teacher_checkpoint:
        return None
    params, teacher_config = load_params(config.teacher_checkpoint)
    if teacher_config.get("task") != task.name or task.kind != "classification":
        raise UserError(f"teacher_checkpoint {config.teacher_checkpoint} was fine-tuned on "
                        f"{teacher_config.get('task')!r}, not on the classification task {task.name!r}; pass a "
                        "fine-tuning run of this task")
    teacher_config = ml_collections.ConfigDict(teacher_config)
    cfg, _, _, _, family, _ = _encoder(teacher_config)
    if teacher_config.mode == "adapters":
        cfg = dataclasses.replace(cfg, adapter_size=teacher_config.adapter_size)
    encoder = task_encoders.settings(teacher_config.task_encoder) if "task_encoder" in teacher_config else None
    model = task_model(cfg, family, task, teacher_config.mode, teacher_config.get("quantize", "none"), 1, encoder)
    return Teacher(model, params, teacher_config.to_dict(), pathlib.Path(config.teacher_checkpoint))


def prune_plan(config: ml_collections.ConfigDict, total: int) -> prune_lib.Plan:
    """The pruning plan of `config.prune` for a run of `total` steps."""
    p = config.prune
    return prune_lib.Plan(kind=p.kind, sparsity=p.sparsity, scope=p.scope, begin=int(round(p.begin_fraction * total)),
                          end=int(round(p.end_fraction * total)), every=p.every)


def _compression(params: Any, config: ml_collections.ConfigDict, plan: prune_lib.Plan,
                 layer_index: layout.LayerIndex, workdir: pathlib.Path) -> dict[str, Any]:
    """What a run that makes a smaller model adds to its results (and the int8 weights it writes)."""
    out: dict[str, Any] = {"parameters": int(sum(x.size for x in jax.tree.leaves(params)))}
    if config.quantize == "int8":
        int8 = quantize_lib.int8_params(jax.device_get(params))
        atomic_write(workdir / "int8_params.msgpack", flax.serialization.msgpack_serialize(int8))
        out.update(float32_bytes=quantize_lib.nbytes(params), int8_bytes=quantize_lib.nbytes(int8))
    if plan.kind != "none":
        out["sparsity"] = prune_lib.sparsity(params, layer_index)
        out["nonzero_parameters"] = int(sum((jnp.asarray(x) != 0).sum() for x in jax.tree.leaves(params)))
        out["heads_left"] = prune_lib.heads_left(params, layer_index)
    return out


def _results(run: run_lib.Run, summary: dict, job: Job, latest: dict, evaluate: Callable[[Any], dict],
             workdir: pathlib.Path, t0: float) -> dict[str, Any]:
    """What a fine-tuning run reports (written to results.json), or a short record when it was
    preempted. `latest` holds the last evaluation; a workdir whose run had already finished has
    none yet, so its final parameters are scored here."""
    config = job.config
    if summary["preempted"]:
        return {"task": job.task, "mode": config.mode, "steps": summary["step"], "scores": {}, "preempted": True}
    if not latest:
        latest.update(evaluate(run.state["params"]))
    train_loss, evals = _record(run.writer.steps(), config.log_every, summary["step"])
    results = {
        "task": job.task, "kind": job.kind, "mode": config.mode, "init_checkpoint": config.init_checkpoint,
        "steps": summary["step"], "scores": latest["scores"], "primary": job.primary, "evals": evals,
        "train_loss": train_loss, "seconds": time.time() - t0,
    }
    outputs.write_results(workdir, results)
    return results


def _seq2seq_model(config: ml_collections.ConfigDict) -> tuple[Any, models.Family, Any, Any, str, int | None]:
    """(model, its family, pretrained params or None, tokenizer, vocab path, decoder start id or None)
    of an encoder-decoder or UniLM run (`init_checkpoint`: its model, parameters, vocabulary with its sentinels or
    <mask>, and decoder start) or from `model` (scratch; `data.vocab`, `data.extra_ids`,
    `data.add_mask`). The start id is `data.decoder_start` if set, else the pretraining
    objective's: EOS after BART/MASS denoising, the pad id otherwise (T5)."""
    if config.init_checkpoint:
        pretrained, pre = load_params(config.init_checkpoint)
        model_config = ml_collections.ConfigDict(models.run_block(config.model, pre["model"]))
        data = {**pre["data"], **config.data.to_dict()}
        data["vocab"] = config.data.vocab or pre["data"].get("vocab") or str(DEFAULT_VOCAB)
        data["objective"] = pre["data"].get("objective")
    else:
        pretrained, data = None, config.data.to_dict()
        model_config = ml_collections.ConfigDict(models.run_block(config.model))
        data["vocab"] = data.get("vocab") or str(DEFAULT_VOCAB)
    tokenizer = for_data(data)
    if model_config.get("vocab_size") is None:
        model_config.vocab_size = tokenizer.vocab_size
    if tokenizer.vocab_size != model_config.vocab_size:
        raise UserError(f"vocabulary {data['vocab']} (extra_ids={data.get('extra_ids') or 0}, add_mask="
                        f"{bool(data.get('add_mask'))}) has {tokenizer.vocab_size} tokens but the model embeds "
                        f"{model_config.vocab_size}; set data.vocab, data.extra_ids or data.add_mask to the "
                        "pretraining run's")
    model = models.build(model_config)
    way = decoding_of(model)
    if way is None or not way.transduces:
        raise UserError(f"task {config.task} needs an encoder-decoder (t5, bart) or UniLM but the model is "
                        f"{model_config.family}; use configs/finetune/seq2seq.py's model or a BART/T5/MASS/UniLM "
                        "checkpoint")
    start = decoder_start_id(data, model, tokenizer) if way.takes_start else None
    config.model = model_config  # what config.json records: the block the model is built from (as `encoder_trunk`)
    return model, models.family(model_config.family), pretrained, tokenizer, str(data["vocab"]), start


def seq2seq_arrays(examples: list[dict], tokenizer: Any, source_length: int, target_length: int,
                   decoder_start: int) -> dict[str, np.ndarray]:
    """Teacher-forcing rows of (source, target) examples: each side tokenized, cut to its row
    length less one and closed with EOS (so a cut target still teaches the model to stop)."""
    eos = [tokenizer.eos_id]
    inputs = [np.asarray(tokenizer.encode(e["source"])[: source_length - 1] + eos) for e in examples]
    targets = [np.asarray(tokenizer.encode(e["target"])[: target_length - 1] + eos) for e in examples]
    return seq2seq_rows(inputs, targets, source_length, target_length, tokenizer.pad_id, decoder_start)


def _weighted_batches(arrays: dict[str, np.ndarray], batch_size: int) -> list[dict[str, np.ndarray]]:
    """Rows cut into batches of `batch_size`, the last filled with weight-0 copies, so that summed
    metrics (`Run.evaluator`) count every row once and every batch has one compiled shape."""
    n = len(arrays["input_ids"])
    batches = []
    for start in range(0, n, batch_size):
        rows = np.arange(start, start + batch_size)
        batch = {k: v[rows % n] for k, v in arrays.items()}
        batch["target_weights"] = batch["target_weights"] * (rows < n)[:, None]
        batches.append(batch)
    return batches


def _seq2seq_job(config: ml_collections.ConfigDict, task: tasks.Task) -> Job:
    """A seq2seq task: teacher-forced training with the seq2seq objective (`label_smoothing`),
    evaluation by generation (`generation.*`: num_beams, length_penalty, max_new_tokens, default
    data.max_target_length) on the first `eval_examples` of each evaluation split, scored by the
    task (ROUGE-1/2/L/Lsum, BLEU). An encoder-decoder is also scored teacher-forced on the same
    examples (`perplexity`, `token_accuracy`): a toy-budget model that decodes one degenerate
    string for every source still ranks by them. A family with its own seq2seq training (UniLM:
    `[CLS] source [SEP] target [SEP]` under the sequence-to-sequence mask, MLM on
    `data.target_mask_prob` of the target tokens; GPT2GPT and LSTM2LSTM: the seq2seq loss plus
    their two LM losses) trains and decodes its way, and is scored by generation alone."""
    if config.mode != "full":
        raise UserError(f"mode={config.mode!r}: seq2seq tasks fine-tune the whole model; use mode=full")
    model, family, pretrained, tokenizer, vocab, start = _seq2seq_model(config)
    config.data.vocab = vocab
    validation.check(config)
    source_length, target_length = config.data.max_seq_length, config.data.get("max_target_length", 64)
    options = dict(config.get("generation", {}))
    generation_options = dict(num_beams=options.get("num_beams", 1), length_penalty=options.get("length_penalty", 1.0),
                              max_new_tokens=options.get("max_new_tokens") or target_length)
    way = require(model)
    generation_options["eos_id"] = way.end_id(tokenizer)
    if way.takes_mask:
        generation_options["mask_id"] = tokenizer.mask_id
    if way.takes_start:
        generation_options["decoder_start_id"] = start
    splits = _training_splits(config.data, task)
    if family.seq2seq_training is not None:  # the family's own (UniLM's masked targets)
        rows, objective, example = family.seq2seq_training(config, tokenizer, splits["train"], source_length,
                                                           target_length)
    else:
        train_arrays = seq2seq_arrays(splits["train"], tokenizer, source_length, target_length, start)
        rows = ShuffledRows(train_arrays, config.batch_size, config.seed)
        objective = objectives.get({"name": "seq2seq", "label_smoothing": config.get("label_smoothing", 0.0)})
        example = {k: v[:1] for k, v in train_arrays.items()}
    n_train = len(splits["train"])  # one row per example, whichever training
    total, opt_cfg = steps_and_optimizer(config, n_train)
    eval_examples = config.get("eval_examples") or None
    held_out = {} if family.seq2seq_training is not None else {
        split: _weighted_batches(seq2seq_arrays(splits[split][:eval_examples], tokenizer, source_length, target_length,
                                                start), config.eval_batch_size)
        for split in task.eval_splits}

    def evaluator(run: run_lib.Run) -> Callable[[Any], dict[str, Any]]:
        teacher_forced = {split: run.evaluator(batches) for split, batches in held_out.items()}

        def evaluate(params) -> dict[str, Any]:
            scores, preds = {}, {}
            for split in task.eval_splits:
                examples = splits[split][:eval_examples]
                preds[split] = _generate_texts(model, params, examples, tokenizer, source_length,
                                               config.eval_batch_size, generation_options)
                prefix = "" if len(task.eval_splits) == 1 else f"{split}_"
                scores.update({prefix + k: v for k, v in task.score(examples, preds[split]).items()})
                if split in teacher_forced:
                    m = teacher_forced[split](params)
                    scores.update({prefix + "perplexity": m["perplexity"], prefix + "token_accuracy": 100 * m["lm_accuracy"]})
            return {"scores": scores, "predictions": preds}
        return evaluate

    def finish(params: Any, predictions: dict[str, Any], workdir: pathlib.Path) -> dict[str, Any]:
        for split, texts in predictions.items():
            atomic_write(workdir / f"predictions_{split}.txt", "".join(t.replace("\n", " ") + "\n" for t in texts))
        return {}

    return Job(config=ml_collections.FrozenConfigDict(config), task=task.name, kind=task.kind, primary=task.primary,
               model=model, objective=objective, rows=rows, example=example, n_train=n_train, total=total,
               optimizer=lambda params: optimizer_lib.make(opt_cfg, total),
               start_params=None if pretrained is None else (
                   lambda fresh: merge_pretrained(fresh, pretrained, config.init_checkpoint)),
               evaluator=evaluator, finish=finish,
               described=lambda params: f"seq2seq, {sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M params")


def _generate_texts(model: Any, params: Any, examples: list[dict], tokenizer: Any, source_length: int,
                    batch_size: int, options: dict[str, Any]) -> list[str]:
    """The decoded generation (up to EOS) for every example's source, in batches of one shape
    (rows of source_length; the last batch filled by wrapping around, then trimmed) so that
    decoding compiles once."""
    ids = np.asarray([frame_source(model, tokenizer, tokenizer.encode(e["source"]), source_length) for e in examples],
                     dtype=object)
    texts = []
    for begin in range(0, len(examples), batch_size):
        rows = [list(ids[i % len(examples)]) for i in range(begin, begin + batch_size)]
        width = source_length
        batch = np.array([r + [tokenizer.pad_id] * (width - len(r)) for r in rows], np.int32)
        mask = (np.arange(width)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
        tokens = generate(model, params, batch, mask, **options)
        eos = options["eos_id"]
        for row in tokens[: min(batch_size, len(examples) - begin)].tolist():
            end = row.index(eos) if eos in row else len(row)
            texts.append(tokenizer.decode(row[:end]))
    return texts


def _record(steps: dict[int, dict[str, float]], log_every: int, total: int) -> tuple[list[float], list[dict]]:
    """(the training loss at the log steps, every evaluation) from the run's metrics rows, which
    hold the steps of an interrupted run and of its resumption alike."""
    train_loss = [row["loss"] for s, row in steps.items() if "loss" in row and (s % log_every == 0 or s == total)]
    evals = [{"step": s, **{k[len("eval_"):]: v for k, v in row.items() if k.startswith("eval_")}}
             for s, row in steps.items() if any(k.startswith("eval_") for k in row)]
    return train_loss, evals


def batched_outputs(apply: Callable, params: Any, features: Features, batch_size: int, shard: Callable,
                    keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The model's outputs for every row, in fixed-size batches (the last padded, then trimmed);
    `keys`: the arrays the trunk reads (`input_keys`)."""
    arrays = {k: v for k, v in features.arrays.items() if k in keys}
    n = len(arrays["input_ids"])
    chunks = []
    for start in range(0, n, batch_size):
        rows = np.arange(start, start + batch_size) % n  # wrap to fill the last batch
        out = apply(params, shard({k: v[rows] for k, v in arrays.items()}))
        chunks.append({k: np.asarray(v)[: min(batch_size, n - start)] for k, v in jax.device_get(out).items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
