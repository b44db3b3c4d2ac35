"""Every check of a run config's values, in one place, run before anything is read or written.

A bad value caught here ends the run with one line naming the key, the value and the fix, instead
of a silent run (total_steps=0 trains nothing and exits 0), a crash deep inside the loop or jax
(batch_size=0, an IndivisibleError), or a workdir left describing a run that never started. Each
run's one resolution step calls `check` once, on the config as the run will use it (the init
checkpoint's model block and vocabulary adopted), before the corpus is read or the workdir
written: `bertology.train.loop.resolved` for pretraining, the fine-tuning jobs
(`bertology.train.finetune`); and the sweep for every config it will generate (`check_sweep`)
before its first run.

Keys a config does not have are skipped, so one table serves pretraining and fine-tuning configs.
What the model config itself rejects (layers, heads, activations: `TransformerConfig`) is checked
there, when the model is built, which is also before anything is written.

`optimizer.warmup_steps` larger than `total_steps` is allowed on purpose: the schedule clamps it
(`train.optimizer.schedule`), which short smoke runs of the big recipes rely on.

The masked-prediction cap must not cut the masking rate (`MaskedLM.validate`, data/transforms.py).
Masked-LM data (the `mlm` transform and those built on it, `unilm`: `data.masked_lm_prob` and
`data.max_predictions_per_seq` are read only there) predicts, per row of n non-pad tokens,
min(max_predictions_per_seq, max(1, round(masked_lm_prob · n))) positions (`data/masking.py`,
BERT's create_pretraining_data; Python's rounding, half to even) whatever the unit: tokens, whole
words, n-grams, spans or entities are chosen within that budget, and span or n-gram choices may
stop short of it but never pass it. A full row (n = max_seq_length) is refused a cap below
round(masked_lm_prob · max_seq_length): the rate asked for would silently be lower on long rows.
A recipe whose reference caps below that on purpose (ALBERT and MobileBERT pretrain at length 512
with 20 predictions) sets `data.allow_capped_predictions=True`. Other objectives that carry the two
keys from `recipes.pretraining` without reading them (causal, span corruption, BART, MASS, XLNet,
...) are not checked.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any, Callable

import ml_collections

from bertology.errors import UserError

MISSING = object()


def _integer(lo: int) -> tuple[str, Callable[[Any], bool]]:
    return f"an integer >= {lo}", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _number(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> tuple[str, Callable[[Any], bool]]:
    text = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def ok(v: Any) -> bool:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return False
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)

    return text, ok


def _positive() -> tuple[str, Callable[[Any], bool]]:
    return "a number > 0", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _boolean() -> tuple[str, Callable[[Any], bool]]:
    return "True or False", lambda v: isinstance(v, bool)


def _one_of(*names: str) -> tuple[str, Callable[[Any], bool]]:
    return "one of " + ", ".join(repr(n) for n in names), lambda v: v in names


# (key, (requirement, test), what the key means: the fix names it). None passes for the keys in
# _UNSET_ALLOWED, where it means "derive it" (fine-tuning's steps from epochs, warmup from a fraction,
# dropout from the checkpoint).
RULES: tuple[tuple[str, tuple[str, Callable[[Any], bool]], str], ...] = (
    ("total_steps", _integer(1), "the number of optimizer steps"),
    ("epochs", _integer(1), "passes over the training set"),
    ("batch_size", _integer(1), "examples per optimizer step"),
    ("eval_batch_size", _integer(1), "examples per evaluation batch"),
    ("grad_accum_steps", _integer(1), "microbatches per step; 1 turns accumulation off"),
    ("log_every", _integer(1), "steps between log lines"),
    ("logging.wandb.mode", _one_of("online", "offline"), "online, or offline to keep the W&B run in the workdir"),
    ("checkpoint_every", _integer(1), "steps between checkpoints"),
    ("checkpoint_every_minutes", _number(0, math.inf), "minutes between timed checkpoints; 0 turns them off"),
    ("keep_checkpoints", _integer(1), "how many checkpoints to keep"),
    ("eval_every", _integer(0), "steps between evaluations; 0 evaluates only at the end"),
    ("eval_batches", _integer(1), "held-out batches per evaluation"),
    ("optimizer.name", _one_of("adamw", "lamb", "adamax"), "the optimizer"),
    ("optimizer.schedule", _one_of("linear", "cosine", "slanted_triangular"), "the decay after warmup"),
    ("optimizer.stlr_ratio", _number(1, math.inf), "how many times the slanted triangle's peak exceeds its ends, e.g. 32"),
    ("unfreeze_every_epochs", _number(0, math.inf), "epochs between unfreezing layer groups; 0 turns it off"),
    ("optimizer.learning_rate", _positive(), "the peak learning rate, e.g. 1e-4"),
    ("optimizer.warmup_steps", _integer(0), "steps of linear warmup"),
    ("optimizer.schedule_steps", _integer(1), "the schedule's horizon (unset: total_steps)"),
    ("optimizer.warmup_fraction", _number(0, 1), "the fraction of the steps spent warming up"),
    ("optimizer.end_learning_rate_fraction", _number(0, 1), "the final rate as a fraction of the peak"),
    ("optimizer.b1", _number(0, 1, hi_open=True), "Adam's first-moment decay, e.g. 0.9"),
    ("optimizer.b2", _number(0, 1, hi_open=True), "Adam's second-moment decay, e.g. 0.999"),
    ("optimizer.eps", _positive(), "Adam's epsilon, e.g. 1e-6"),
    ("optimizer.weight_decay", _number(0, 1), "decoupled weight decay, e.g. 0.01"),
    ("optimizer.clip_norm", _positive(), "the global gradient-norm clip, e.g. 1.0"),
    ("optimizer.layerwise_lr_decay", _number(0, 1, lo_open=True), "per-layer rate decay; 1.0 turns it off"),
    ("model.dropout_rate", _number(0, 1, hi_open=True), "the dropout probability"),
    ("model.attention_dropout_rate", _number(0, 1, hi_open=True), "the attention dropout probability"),
    ("model.max_position_embeddings", _integer(1), "the length of the position table"),
    ("data.max_seq_length", _integer(2), "tokens per row, special tokens included"),
    ("data.max_predictions_per_seq", _integer(1), "masked positions per row"),
    ("data.masked_lm_prob", _number(0, 1, lo_open=True), "the fraction of tokens masked"),
    ("data.allow_capped_predictions", _boolean(), "whether the prediction cap may cut the masking rate"),
    ("data.mask_prob", _number(0, 1), "of the chosen tokens, the fraction replaced by [MASK]"),
    ("data.random_prob", _number(0, 1), "of the chosen tokens, the fraction replaced by a random token"),
    ("data.short_seq_prob", _number(0, 1), "the fraction of shorter rows"),
    ("data.dupe_factor", _integer(1), "masked copies of the corpus (static masking)"),
    ("data.masking", _one_of("static", "dynamic"), "static (precomputed copies) or dynamic masking"),
    ("data.window_documents", _integer(2), "documents per stream window, e.g. 2048"),
    ("data.doc_stride", _integer(1), "tokens between question-answering windows"),
    ("data.max_query_length", _integer(1), "question tokens per window"),
    ("data.cls_position", _one_of("first", "last"), "where task inputs put the summary token (XLNet: last)"),
    ("data.padding_side", _one_of("right", "left"), "which side task inputs are padded on (XLNet: left)"),
    ("data.reuse_len", _integer(1), "XLNet: tokens per row that continue the lane and are cached as memory"),
    ("data.num_predict", _integer(1), "XLNet: predicted tokens per row (the reference: 85 of 512)"),
    ("data.perm_size", _integer(1), "XLNet: the block length of the factorisation order"),
    ("data.mask_alpha", _integer(1), "XLNet: context tokens per predicted n-gram token (K = 6)"),
    ("data.mask_beta", _integer(1), "XLNet: predicted tokens per mask_alpha context tokens (1)"),
    ("data.bi_data", _boolean(), "XLNet: half the batch as reversed lanes"),
    ("eval.mem_len", _integer(0), "memory slots per layer at evaluation (unset: the training model.mem_len)"),
    ("eval.clamp_len", _integer(-1), "the largest relative distance encoded at evaluation; -1 clamps nothing"),
    ("eval.same_length", _boolean(), "at evaluation every query sees mem_len keys (Transformer-XL's eval)"),
    ("model.activation_dropout_rate", _number(0, 1, hi_open=True), "the dropout probability after the FFN activation"),
    ("data.max_skipped_fraction", _number(0, 1), "the share of a GLUE file's rows it may skip, e.g. 0.05"),
    ("lm_weight", _number(0, 100), "the weight of GPT's auxiliary LM loss in fine-tuning (Radford et al.: 0.5)"),
    ("distill_temperature", _positive(), "the softmax temperature of task distillation, e.g. 1.0"),
    ("quantize", _one_of("none", "int8"), "none or Q8BERT's int8 quantization-aware training"),
    ("quant_ema_decay", _number(0, 1, hi_open=True), "the activation ranges' moving-average decay, e.g. 0.9999"),
    ("prune.kind", _one_of("none", "magnitude", "heads"), "the pruning method"),
    ("prune.sparsity", _number(0, 1, hi_open=True), "the final fraction pruned, e.g. 0.9"),
    ("prune.scope", _one_of("global", "per_matrix"), "where magnitude pruning ranks weights"),
    ("prune.begin_fraction", _number(0, 1), "when pruning starts, as a fraction of the steps"),
    ("prune.end_fraction", _number(0, 1), "when pruning reaches its sparsity, as a fraction of the steps"),
    ("prune.every", _integer(1), "steps between mask updates"),
    ("task_encoder.name", _one_of("none", "bilstm", "bilstm_attn"), "the task model under the head (GLUE's baselines)"),
    ("task_encoder.hidden_size", _integer(1), "the task encoder's LSTM units per direction (GLUE's baselines: 1500)"),
    ("task_encoder.num_layers", _integer(1), "the layers of each of the task encoder's BiLSTMs (GLUE's baselines: 2)"),
    ("task_encoder.classifier_hidden_size", _integer(1), "the hidden layer of the task encoder's classifier MLP"),
    ("task_encoder.dropout_rate", _number(0, 1, hi_open=True), "the task encoder's dropout probability"),
    ("pals.size", _integer(0), "each task's projected attention width d_s (Stickland & Murray: 204); 0: no PALs"),
    ("pals.heads", _integer(1), "the attention heads of each PAL (Stickland & Murray: 12)"),
    ("pals.shared_projections", _boolean(), "one down and up projection per task (the paper's PALs) or per layer"),
)
_UNSET_ALLOWED = ("total_steps", "optimizer.warmup_steps", "optimizer.schedule_steps", "eval.mem_len",
                  "eval.clamp_len", "eval.same_length", "data.max_skipped_fraction",
                  "model.dropout_rate", "model.attention_dropout_rate")  # fine-tuning's: the checkpoint's


def get(config: ml_collections.ConfigDict, key: str) -> Any:
    """The value at a dotted `key`, or `MISSING` where the config has no such key."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
            return MISSING
        node = node[part]
    return node


def refuse(key: str, value: Any, problem: str, fix: str) -> UserError:
    """The one-line error for a bad value: the key, the value, what is wrong and the fix."""
    return UserError(f"{key}={value!r} {problem}; {fix}")


def check(config: ml_collections.ConfigDict) -> None:
    """Raise `UserError` for the first bad value of a pretraining or fine-tuning config."""
    for key, (requirement, ok), meaning in RULES:
        value = get(config, key)
        if value is MISSING or (value is None and key in _UNSET_ALLOWED):
            continue
        if not ok(value):
            raise refuse(key, value, f"is not {requirement}", f"set --config.{key} to {requirement} ({meaning})")
    if get(config, "total_steps") is None and get(config, "epochs") in (None, MISSING):
        raise UserError("total_steps is not set; set --config.total_steps to the number of optimizer steps")
    mask, random = get(config, "data.mask_prob"), get(config, "data.random_prob")
    if MISSING not in (mask, random) and mask + random > 1:
        raise refuse("data.random_prob", random, f"plus data.mask_prob={mask!r} exceeds 1",
                      "lower one of them (BERT: 0.8 [MASK] and 0.1 random)")
    _check_length(config)
    _check_corpora(config)
    _check_transform(config)
    _check_batching(config)
    _check_eval(config)
    _check_multitask(config)


def _check_multitask(config: ml_collections.ConfigDict) -> None:
    """The multi-task keys (`bertology.train.multitask`): distinct encoder tasks, a weight >= 0 per
    task, a known sampling, per-task data and dropout for known tasks (a preset's entries for the
    tasks a run leaves out are unused), PAL heads that divide the PAL width."""
    names = get(config, "tasks")
    if names is MISSING:
        return
    from bertology import tasks
    from bertology.train.multitask import SAMPLING

    names = tuple(names)
    encoder_tasks = sorted(n for n, module in tasks.MODULES.items() if module != "seq2seq")
    fix = f"list encoder tasks, e.g. --config.tasks='(\"sst2\", \"rte\")' (tasks: {', '.join(encoder_tasks)})"
    if not names:
        raise refuse("tasks", names, "names no task", fix)
    for name in names:
        if name not in tasks.MODULES:
            raise refuse("tasks", names, f"names {name!r}, which is no task", fix)
        if name not in encoder_tasks:
            raise refuse("tasks", names, f"names the seq2seq task {name!r}, which trains a whole encoder-decoder", fix)
        if names.count(name) > 1:
            raise refuse("tasks", names, f"names {name!r} twice", "name each task once")
    mixture = get(config, "mixture")
    if mixture not in (None, MISSING):
        weights = tuple(mixture)
        if len(weights) != len(names):
            raise refuse("mixture", weights, f"has {len(weights)} weights for the {len(names)} tasks {names}",
                          "give one weight per task, in the order of tasks, or unset it (sizes)")
        for name, w in zip(names, weights):
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
                raise refuse("mixture", weights, f"gives {name} the weight {w!r}",
                              "give each task a number >= 0 (its share of the steps)")
        if not sum(weights):
            raise refuse("mixture", weights, "gives every task weight 0", "give some task a weight > 0")
    sampling = get(config, "sampling")
    if sampling is not MISSING and sampling not in SAMPLING:
        raise refuse("sampling", sampling, f"is not one of {SAMPLING}", "set --config.sampling=proportional "
                      "(MT-DNN: by size), sqrt or annealed (Stickland & Murray)")
    data = get(config, "data")
    for name, entries in (get(config, "task_data") or {}).items():
        if name not in encoder_tasks:
            raise refuse(f"task_data.{name}", entries.to_dict(), "is for no encoder task", fix)
        for key in entries:
            if data is not MISSING and key not in data:
                raise refuse(f"task_data.{name}.{key}", entries[key], "is not a key of the data block",
                              "use data keys (dir, files, columns, labels, max_seq_length, ...)")
    for name, rate in (get(config, "head_dropout") or {}).items():
        if name not in encoder_tasks:
            raise refuse(f"head_dropout.{name}", rate, "is for no encoder task", fix)
        if rate is not None and not _number(0, 1, hi_open=True)[1](rate):
            raise refuse(f"head_dropout.{name}", rate, "is not a dropout probability in [0, 1)",
                          "set it in [0, 1), e.g. 0.1, or None for the model's rate")
    size, heads = get(config, "pals.size"), get(config, "pals.heads")
    if MISSING not in (size, heads) and size and size % heads:
        raise refuse("pals.heads", heads, f"does not divide pals.size={size}", "pick heads that divide the PAL width")


def _check_eval(config: ml_collections.ConfigDict) -> None:
    """The `eval` block sets model settings for held-out evaluation (unset: training's), so each
    must be one the model block has, and `same_length` needs memory at evaluation."""
    block, model = get(config, "eval"), get(config, "model")
    if MISSING in (block, model):
        return
    for key, value in block.items():
        if value is not None and key not in model:
            raise refuse(f"eval.{key}", value, f"is not a setting of this {model.get('family')} model",
                          "remove it (eval takes keys of the model block, e.g. mem_len)")
    mem_len = block.get("mem_len")
    mem_len = model.get("mem_len", 0) if mem_len is None else mem_len
    same = block.get("same_length")
    if (model.get("same_length") if same is None else same) and not mem_len:
        raise refuse("eval.same_length", True, "needs memory at evaluation (each query sees mem_len keys)",
                      "set --config.eval.mem_len > 0 or --config.eval.same_length=False")


def _check_length(config: ml_collections.ConfigDict) -> None:
    """Rows must fit the model's position table (when the model has one)."""
    length, table = get(config, "data.max_seq_length"), get(config, "model.max_position_embeddings")
    if MISSING in (length, table) or get(config, "model.positions") in ("relative_bias", "none"):
        return
    offset = get(config, "model.position_offset")
    room = table - (0 if offset in (None, MISSING) else offset)
    if length > room:
        raise refuse("data.max_seq_length", length, f"exceeds the model's {room} positions "
                      f"(model.max_position_embeddings={table})", "lower data.max_seq_length or raise the table")


def _check_corpora(config: ml_collections.ConfigDict) -> None:
    """A pretraining mixture (`data.corpora`, `data/pipeline.py`): instead of `data.corpus`, each
    entry a {"path": ..., "weight": ...} whose path exists (a `tfds:` or `hf:` name is looked up
    when the corpus is read) and whose weight is a finite number > 0; and an objective that reads
    rows, since a contiguous one reads one token stream."""
    entries = get(config, "data.corpora")
    if entries in (MISSING, None) or not len(entries):
        return
    from bertology.data import hub, prepare, transforms

    entries = tuple(entries)
    example = '--config.data.corpora=\'({"path": "a.txt", "weight": 3}, {"path": "b.parquet", "weight": 1})\''
    corpus = get(config, "data.corpus")
    if corpus not in (MISSING, None):
        raise refuse("data.corpora", entries, f"is set together with data.corpus={corpus!r}",
                     "set only one: data.corpus for one corpus, or data.corpora for a mixture with data.corpus=None")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"path", "weight"} or not isinstance(entry["path"], str):
            raise refuse(f"data.corpora[{i}]", entry, 'is not {"path": PATH, "weight": NUMBER}',
                         f"give each corpus its path and weight, e.g. {example}")
        weight, path = entry["weight"], entry["path"]
        if not _positive()[1](weight) or not math.isfinite(weight):
            raise refuse(f"data.corpora[{i}].weight", weight, "is not a finite number > 0",
                         "give each corpus a weight > 0 (its share of the rows is weight / the sum of the weights)")
        if not path.startswith((prepare.TFDS_PREFIX, hub.PREFIX)) and not pathlib.Path(path).expanduser().exists():
            raise refuse(f"data.corpora[{i}].path", path, "does not exist",
                         "give the path of a text file, table or directory (or tfds:NAME@DIR, hf:NAME)")
    objective = get(config, "data.objective")
    if len(entries) > 1 and objective not in (MISSING, None) and transforms.lookup(objective).contiguous:
        raise refuse("data.corpora", entries, f"mixes rows, but data.objective={objective!r} reads one "
                     "contiguous token stream", "set data.corpus to one corpus")


def _check_transform(config: ml_collections.ConfigDict) -> None:
    """The data transform's own rules (`Transform.validate`: the masked-LM prediction cap, XLNet's
    row parts), for a config with a `data` block (`data.objective`, default `mlm`)."""
    data = config.get("data")
    if data is None:
        return
    from bertology.data import transforms

    objective = data.get("objective", "mlm")
    if objective is not None:  # None names no transform: nothing to check
        transforms.lookup(objective).validate(config)


def _check_batching(config: ml_collections.ConfigDict) -> None:
    """The batch must split into the microbatches asked for, and over the devices that the mesh's
    `batch` rule shards it on (the mesh is built the way the run builds it)."""
    from bertology.train import sharding

    batch, accum = config.batch_size, get(config, "grad_accum_steps")
    if accum is not MISSING and batch % accum:
        raise refuse("grad_accum_steps", accum, f"does not divide batch_size={batch}",
                      "pick grad_accum_steps that divides batch_size")
    mesh = get(config, "mesh")
    if mesh is MISSING:
        return
    devices = sharding.batch_devices(sharding.make_mesh(mesh), sharding.rules_for(mesh))
    for key in ("batch_size", "eval_batch_size"):
        value = get(config, key)
        if value is not MISSING and value % devices:
            raise refuse(key, value, f"does not divide over the {devices} devices the batch is sharded on "
                          f"(mesh.shape={tuple(mesh.shape)}, strategy {mesh.get('strategy')!r})",
                          f"use a multiple of {devices} or change mesh.shape")


def check_sweep(config: ml_collections.ConfigDict) -> None:
    """The sweep's own keys (`bertology.sweep`); the runs it generates go through `check`."""
    for key, (requirement, ok) in (("reference_steps", _integer(1)), ("batch_size", _integer(1)),
                                   ("max_seq_length", _integer(2))):
        if not ok(config[key]):
            raise refuse(key, config[key], f"is not {requirement}", f"set --config.{key} to {requirement}")
    budgets = tuple(config.budgets)
    if not budgets or any(not isinstance(b, (int, float)) or b <= 0 for b in budgets):
        raise refuse("budgets", budgets, "must be one or more numbers > 0 (multiples of reference_steps of tiny BERT)",
                      "e.g. --config.budgets='(0.5, 1.0)'")
    seeds = tuple(config.get("seeds", (0,)))
    if not seeds or len(set(seeds)) != len(seeds) or any(not isinstance(x, int) or isinstance(x, bool) for x in seeds):
        raise refuse("seeds", seeds, "must be one or more distinct integers", "e.g. --config.seeds='(0, 1, 2)'")
    families = tuple(config.families)
    known = sorted(p.stem for p in pathlib.Path(config.configs_dir).glob("*.py"))
    unknown = [f for f in families if f not in known]
    if unknown or not (families or config.get("variants")):  # a sweep of variants alone needs no family
        raise refuse("families", families, f"names no config in {config.configs_dir}/: {unknown or 'none given'}",
                      f"use some of {', '.join(known)}, or give variants")
