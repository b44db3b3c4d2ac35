"""Multi-task fine-tuning: one shared encoder, a head per task (MT-DNN), optionally each task's
projected attention layers (BERT and PALs).

MT-DNN (Liu, He, Chen & Gao 2019, §3.1 and Algorithm 1) fine-tunes one BERT encoder on several
tasks at once: each task keeps its own output layer and loss, and every mini-batch holds one
task's rows, so a step updates the shared encoder and that task's head. Tasks here are the
single-task builders (`config.tasks` names them: GLUE, CoNLL-2003, SQuAD, SWAG, the embedded task,
your own files), each with its own kind (classification, regression, token, qa, choice), rows and
scores exactly as a single-task run of it has them. Stickland & Murray 2019 add to each task its
PALs beside every layer of the shared encoder (`pals.size` > 0; `bertology.models.pals`).

Which task a step trains (`sampling`, `mixture`): task t is drawn with probability ∝ w_t^α,
w_t its training rows (or its `mixture` weight), α = 1 (`proportional`: MT-DNN's rule, each task in
proportion to its size, as its shuffled union of every task's mini-batches gives), 1/2 (`sqrt`)
or `annealed` from 1 down to 0.2 over the epochs (α = 1 − 0.8·e/(E − 1) in epoch e = 0..E − 1:
Stickland & Murray 2019's sampling, their best). The draw of step s is a generator seeded with
(seed, s): a function of the seed and the step, never of earlier draws, so a run resumed from any
checkpoint trains the same tasks in the same order. Each task's rows come from its own endless
`ShuffledRows`, whose positions are checkpointed with the step (`TaskMixture`). An epoch (for
`epochs` and the annealing) is every task's batches once, as MT-DNN's.

Evaluation scores every task as its single-task run does and reports `<task>/<metric>`, and the
`average` of the tasks' primary scores (MNLI's: the mean of matched and mismatched). Per-step
training metrics are `<task>/<metric>` on the steps that trained the task (TensorBoard plots each
task's curve). Each task's predictions and leaderboard files go to WORKDIR/<task>/; `parameters.md`
compares the parameters stored to serve every task: a fine-tuned model per task, Houlsby adapters
per task, this run's shared encoder with a head per task, and with PALs.

Continued single-task fine-tuning from a multi-task run (MT-DNN's last stage) is a single-task
run with `--config.init_checkpoint=<multi-task workdir>`: the run's task picks its head
(`finetune.start_from_tasks`). The multi-task run's config.json records the model block it built
(the init checkpoint's), which that run reads; PALs belong to the multi-task model and are left out.

Options of single-task runs that change its loss or its optimizer's shape (a teacher, int8
training, pruning, GPT's LM loss, gradual unfreezing) are refused in one line. MT-DNN's answer
modules (a SAN for classification, pairwise ranking for QNLI) are not here: each task's head is the
single-task one.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from ml_collections.config_dict import placeholder

from bertology import tasks
from bertology.data.rows import ShuffledRows
from bertology.errors import UserError
from bertology.files import atomic_write
from bertology.models.pals import PALSettings
from bertology.models.tasks import Head, MultiTaskModel, TaskModel, head, input_keys, task_of, with_task
from bertology.objectives import Objective, Terms
from bertology.objectives.bert import apply
from bertology.tasks import kinds
from bertology.train import finetune
from bertology.train import run as run_lib
from bertology.train.metrics import log
from bertology.train.step import param_init

SAMPLING = ("proportional", "sqrt", "annealed")
# Single-task options a multi-task run refuses, with the value that turns each off.
SINGLE_TASK_ONLY = (("teacher_checkpoint", None), ("quantize", "none"), ("prune.kind", "none"), ("lm_weight", 0.0),
                    ("unfreeze_every_epochs", 0.0))


def default_config(names: Sequence[str]) -> ml_collections.ConfigDict:
    """Fine-tuning's recipe (`finetune.default_config`) on the tasks `names`, with the multi-task keys:
    `mixture` (a weight per task; None: their sizes), `sampling`, `task_data` (each task's entries
    over the `data` block: its `dir`, and for your own files their `files`, `columns` and `labels`),
    `head_dropout` (a task's dropout before its head; None: the model's) and `pals` (size 0: none)."""
    c = finetune.default_config("+".join(names))
    c.tasks = tuple(names)
    c.mixture = placeholder(tuple)
    c.sampling = "proportional"
    c.task_data = ml_collections.ConfigDict()
    for name in names:
        entries = ml_collections.ConfigDict({"dir": placeholder(str)})
        if tasks.MODULES.get(name) == "custom":  # files, columns and labels are a task of your own files
            entries.files = ml_collections.ConfigDict(c.data.files.to_dict())
            entries.columns = ml_collections.ConfigDict(c.data.columns.to_dict())
            entries.labels = placeholder(str)
        c.task_data[name] = entries
    c.head_dropout = ml_collections.ConfigDict({name: placeholder(float) for name in names})
    c.pals = ml_collections.ConfigDict(dict(size=0, heads=12, shared_projections=True))
    return c


def probabilities(weights: Sequence[float], sampling: str, step: int, total: int, epochs: int) -> np.ndarray:
    """Each task's chance of training at `step` of `total`: ∝ weight^α (the module docstring)."""
    alpha = {"proportional": 1.0, "sqrt": 0.5}.get(sampling)
    if alpha is None:  # annealed: epoch e of `epochs` (equal shares of the steps)
        alpha = 1.0 - 0.8 * (step * epochs // total) / (epochs - 1) if epochs > 1 else 1.0
    w = np.asarray(weights, np.float64) ** alpha
    return w / w.sum()


class TaskMixture:
    """Endless batches, each one task's rows marked with its name (`with_task`): step s draws its
    task from `chances(s)` with a generator seeded by (seed, s), and takes that task's next batch
    from its own rows. The position (step and each task's row position) is what a checkpoint keeps."""

    def __init__(self, rows: dict[str, ShuffledRows], chances: Callable[[int], np.ndarray], seed: int):
        self.rows, self.chances, self.seed = rows, chances, seed
        self.names = list(rows)
        self.step = 0

    def task_at(self, step: int) -> str:
        draw = np.random.default_rng((self.seed, step)).choice(len(self.names), p=self.chances(step))
        return self.names[int(draw)]

    def __next__(self) -> dict[str, np.ndarray]:
        name = self.task_at(self.step)
        self.step += 1
        return with_task(next(self.rows[name]), name)

    def get_state(self) -> dict[str, Any]:
        return {"step": self.step, "positions": {n: r.get_state()["position"] for n, r in self.rows.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        self.step = state["step"]
        for name, rows in self.rows.items():
            rows.set_state({"position": state["positions"][name]})


def loss(params: Any, batch: dict[str, Any], rng: Any, model: MultiTaskModel) -> Terms:
    """The loss of the batch's task, its kind's (`kinds`), each term named `<task>/<term>`."""
    name = task_of(batch)
    terms = kinds.of(head(model.tasks, name).kind).loss(apply(model, params, batch, rng), batch)
    return Terms({f"{name}/{k}": c for k, c in terms.loss.items()}, {f"{name}/{k}": m for k, m in terms.means.items()})


OBJECTIVE = Objective(loss)


def task_data(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Task `name`'s data block: `data` with the entries `task_data.<name>` sets (not None) over it."""

    def over(block: ml_collections.ConfigDict, entries: ml_collections.ConfigDict) -> None:
        for key, value in entries.items():
            if isinstance(value, ml_collections.ConfigDict):
                over(block[key], value)
            elif value is not None:
                block[key] = value

    block = ml_collections.ConfigDict(config.data.to_dict())
    over(block, config.task_data.get(name, ml_collections.ConfigDict()))
    return block


def primary_score(task: tasks.Task, scores: dict[str, float]) -> float:
    """The task's primary score; over several evaluation splits (MNLI), their mean."""
    if task.primary in scores:
        return scores[task.primary]
    return float(np.mean([scores[f"{split}_{task.primary}"] for split in task.eval_splits]))


def _refuse_single_task_options(config: ml_collections.ConfigDict) -> None:
    for key, off in SINGLE_TASK_ONLY:
        node: Any = config
        for part in key.split("."):
            node = node[part]
        if node != off:
            raise UserError(f"{key}={node!r} is an option of single-task fine-tuning; multi-task runs (tasks="
                            f"{tuple(config.tasks)}) do not take it: set {key}={off!r}")


def _check_pals(config: ml_collections.ConfigDict, trunk: finetune.Trunk) -> PALSettings | None:
    """The run's PAL settings (None: no PALs), refused where they cannot work."""
    if not config.pals.size:
        return None
    if trunk.record.task_trunk is not None:
        raise UserError(f"pals.size={config.pals.size}: PALs sit beside the shared encoder's layers, and the "
                        f"{trunk.family} trunk is its family's own; set pals.size=0")
    if config.mode == "features":
        raise UserError(f"pals.size={config.pals.size} with mode='features': the head reads the frozen layers "
                        "through stop_gradient, so PALs would never train; use mode='full' (the paper's) or 'adapters'")
    return PALSettings(config.pals.size, config.pals.heads, config.pals.shared_projections)


def job(config: ml_collections.ConfigDict) -> finetune.Job:
    """The multi-task job of `config` (`tasks` set) for the one fine-tuning driver, `finetune.finetune`."""
    config.task = "+".join(config.tasks)
    trunk = finetune.encoder_trunk(config)  # validates the config, the multi-task keys too
    _refuse_single_task_options(config)
    pals = _check_pals(config, trunk)
    data = {name: task_data(config, name) for name in config.tasks}
    task = {name: tasks.get(name, data[name]) for name in config.tasks}
    features = {name: finetune.task_features(trunk, task[name], data[name]) for name in config.tasks}
    sizes = {name: len(feats["train"].arrays["input_ids"]) for name, (_, feats) in features.items()}
    batches_per_epoch = sum(math.ceil(n / config.batch_size) for n in sizes.values())
    total, opt_cfg = finetune.steps_and_optimizer(config, batches_per_epoch * config.batch_size)
    weights = list(config.mixture) if config.mixture is not None else [sizes[name] for name in config.tasks]
    rows = TaskMixture({name: ShuffledRows(finetune.training_rows(feats), config.batch_size, config.seed)
                        for name, (_, feats) in features.items()},
                       lambda step: probabilities(weights, config.sampling, step, total, config.epochs), config.seed)
    heads = tuple(Head(name, task[name].kind, kinds.of(task[name].kind).width(task[name]), config.head_dropout.get(name))
                  for name in config.tasks)
    model = MultiTaskModel(trunk.cfg, heads, config.mode, trunk.family, pals)
    keys = input_keys(trunk.family)
    examples = {name: {k: v[:1] for k, v in feats["train"].arrays.items() if k in keys}
                for name, (_, feats) in features.items()}
    counts = parameter_counts(trunk, heads, examples, config.adapter_size, pals)
    log("parameters to serve every task:\n" + parameter_table(counts))

    def applied(name: str) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
        """(params, rows of task `name`) -> the outputs of its head, compiled once per task."""
        return jax.jit(lambda p, b: model.apply({"params": p}, with_task(b, name), deterministic=True))

    def evaluator(run: run_lib.Run) -> Callable[[Any], dict[str, Any]]:
        applies = {name: applied(name) for name in config.tasks}

        def evaluate(params: Any) -> dict[str, Any]:
            scores, preds, primaries = {}, {}, []
            for name, (splits, feats) in features.items():
                def outputs(f: kinds.Features, name: str = name) -> dict[str, np.ndarray]:
                    return finetune.batched_outputs(applies[name], params, f, config.eval_batch_size, run.shard, keys)

                own, preds[name] = finetune.task_scores(task[name], splits, feats, outputs, data[name])
                scores.update({f"{name}/{k}": v for k, v in own.items()})
                primaries.append(primary_score(task[name], own))
            return {"scores": {**scores, "average": float(np.mean(primaries))}, "predictions": preds}

        return evaluate

    def finish(params: Any, predictions: dict[str, Any], workdir: pathlib.Path) -> dict[str, Any]:
        for name, (splits, _) in features.items():
            kinds.write(task[name], splits, predictions[name], workdir / name)
        atomic_write(workdir / "parameters.md", parameter_table(counts) + "\n")
        return {"tasks": {name: {"kind": task[name].kind, "primary": task[name].primary, "training_rows": sizes[name]}
                          for name in config.tasks},
                "parameters": counts}

    start = trunk.start
    first = config.tasks[0]
    return finetune.Job(
        config=ml_collections.FrozenConfigDict(config), task=config.task, kind="multitask", primary="average",
        model=model, objective=OBJECTIVE, rows=rows, example=with_task(examples[first], first),
        n_train=sum(sizes.values()), total=total,
        optimizer=finetune.encoder_optimizer(config, trunk, opt_cfg, total, sum(sizes.values()),
                                             finetune.prune_plan(config, total)),
        start_params=None if start is None else (lambda fresh: finetune.start_from(fresh, start, config.init_checkpoint)),
        evaluator=evaluator, finish=finish,
        described=lambda params: f"{len(heads)} tasks, {finetune.trained_share(params, config.mode)}")


def parameter_counts(trunk: finetune.Trunk, heads: Sequence[Head], examples: dict[str, dict[str, np.ndarray]],
                     adapter_size: int, pals: PALSettings | None) -> dict[str, int]:
    """The parameters stored to serve every task, each way of fine-tuning them (Stickland & Murray
    2019's comparison): the encoder alone; a fine-tuned model per task; Houlsby adapters per task
    (the frozen encoder once, each task's adapters, LayerNorms and head; where the family's trunk
    takes adapters); one encoder with a head per task (MT-DNN); and that with each task's PALs.
    Shapes only (`jax.eval_shape`): nothing is computed."""

    def sizes(model: Any, example: dict[str, np.ndarray], mode: str) -> tuple[int, int]:
        """(all parameters, those `mode` trains) of `model`."""
        params = nn.meta.unbox(jax.eval_shape(param_init(model, example), jax.random.key(0)))
        leaves = jax.tree.leaves(params)
        trains = jax.tree.leaves(finetune.trainable_mask(params, mode))
        return sum(x.size for x in leaves), sum(x.size for x, t in zip(leaves, trains) if t)

    cfg, family = trunk.cfg, trunk.family
    adapted = hasattr(cfg, "adapter_size")  # a Transformer trunk's config; adapters or none
    plain = dataclasses.replace(cfg, adapter_size=None) if adapted else cfg
    # what mode 'features' trains of a full model is all but the encoder: its head
    singles = [sizes(TaskModel(plain, h.kind, h.width, "full", family), examples[h.name], "features") for h in heads]
    counts = {"encoder": singles[0][0] - singles[0][1],
              "full fine-tuning, a model per task": sum(n for n, _ in singles)}
    if adapted and "adapters" in trunk.record.task_modes:
        with_adapters = dataclasses.replace(cfg, adapter_size=adapter_size)
        each = [sizes(TaskModel(with_adapters, h.kind, h.width, "adapters", family), examples[h.name], "adapters")
                for h in heads]
        counts[f"adapters ({adapter_size}), a set per task"] = each[0][0] - each[0][1] + sum(t for _, t in each)
    first = with_task(examples[heads[0].name], heads[0].name)
    counts["multi-task, a head per task"] = sizes(MultiTaskModel(plain, tuple(heads), "full", family), first, "full")[0]
    if pals is not None:
        counts[f"multi-task + PALs ({pals.size}, {pals.heads} heads)"] = sizes(
            MultiTaskModel(plain, tuple(heads), "full", family, pals), first, "full")[0]
    return counts


def parameter_table(counts: dict[str, int]) -> str:
    """A Markdown table of `parameter_counts`: each way's parameters, and as a multiple of the encoder's."""
    encoder = counts["encoder"]
    lines = ["| to serve every task | parameters | × encoder |", "|---|---|---|"]
    lines += [f"| {way} | {n:,} | {n / encoder:.2f} |" for way, n in counts.items()]
    return "\n".join(lines)
