"""Pretraining: any family's corpus stream, model and objective, run by `bertology.train.run`.

A family is (model module, objective module, data stream) picked by name from the config; the
run only knows the objective's contract (see `bertology.objectives`). What is particular to
pretraining lives here: the corpus and its stream of masked batches, held-out evaluation
batches, `init_checkpoint` taking a whole model (and its vocab) from another run, and
`teacher_checkpoint` putting a frozen teacher beside the student (`bertology.train.teacher`):
the student takes the teacher's vocab unless set, and a family that defines
`from_teacher(teacher_params, fresh_params)` (DistilBERT) starts from the teacher's weights.

Held-out evaluation may run the trained parameters under other model settings than training
(the config's `eval` block, set entries over `model`): Transformer-XL evaluates with a longer
memory, `same_length` and a clamp length, as its reference does. `evaluate` re-evaluates a run's
latest checkpoint that way without training it further.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any, Callable, Iterator

import jax
import ml_collections
import numpy as np
from etils import epath

from bertology import models, objectives, validation
from bertology.data import corpus as corpus_lib
from bertology.data import lanes, pipeline, transforms
from bertology.data.embedded import embedded_corpus_path
from bertology.errors import UserError
from bertology.train import optimizer as optimizer_lib
from bertology.train import run as run_lib
from bertology.train import teacher as teacher_lib
from bertology.train.checkpoint import check_shapes, load_params
from bertology.train.metrics import log
from bertology.train.step import CARRY_RESET


def adopt_init_checkpoint(config: ml_collections.ConfigDict) -> Callable[[Any], Any] | None:
    """With `init_checkpoint` set (a pretraining run or a `bertology.convert --from hf` import),
    take its vocab unless set, and return `start(fresh params) -> params` for a new run (a run
    that already has checkpoints in its workdir resumes from those instead).

    A checkpoint of this config's family gives its model block (but for `models.RUN_KEYS`, which
    this config's block sets: how the run computes, its dropout) and all its parameters. One of another
    family is taken only where this family states how (`init_from(params, fresh)` in its module:
    UniLM and bert2bert start from BERT); the config's own model block then stands."""
    if not config.get("init_checkpoint"):
        return None
    where = pathlib.Path(config.init_checkpoint)
    params, source = load_params(config.init_checkpoint)
    family = source["model"]["family"]
    if config.data.vocab is None:
        config.data.vocab = source["data"]["vocab"]
    if family != config.model.family:
        init_from = models.family(config.model.family).init_from
        if init_from is None:
            raise UserError(f"init_checkpoint {config.init_checkpoint} is a {family} model but this config pretrains "
                            f"{config.model.family}; use configs/{family}.py")
        return lambda fresh: init_from(params, fresh)
    config.model = ml_collections.ConfigDict(models.run_block(config.model, source["model"]))

    def start(fresh: Any) -> Any:
        check_shapes(params, fresh, where)
        return params

    return start


def adopt_teacher(config: ml_collections.ConfigDict) -> teacher_lib.Teacher | None:
    """With `teacher_checkpoint` set, the loaded teacher; the student takes its vocab unless set."""
    if not config.get("teacher_checkpoint"):
        return None
    teacher = teacher_lib.load(config.teacher_checkpoint)
    if config.data.vocab is None:
        config.data.vocab = teacher.config["data"]["vocab"]
    return teacher


def resolved(config: ml_collections.ConfigDict) -> tuple[ml_collections.FrozenConfigDict, Any, Callable[[Any], Any] | None,
                                                       teacher_lib.Teacher | None]:
    """The pretraining config as the run will use it: the init checkpoint's model block and vocab,
    the teacher's vocab, the vocabulary's path and size filled in; validated once and frozen, so
    that what config.json records is what every later step reads. Also the tokenizer, the init
    checkpoint's `start(fresh)` (or None) and the teacher (or None)."""
    config = ml_collections.ConfigDict(config.to_dict())  # our own copy, filled in below
    start = adopt_init_checkpoint(config)
    teacher = adopt_teacher(config)
    vocab_path, tokenizer = run_lib.resolve_vocab(config)
    teacher_vocab = None if teacher is None else models.encoder_config(teacher.config["model"]).vocab_size
    if teacher is not None and teacher_vocab != config.model.vocab_size:
        raise UserError(f"teacher_checkpoint {config.teacher_checkpoint} has a {teacher_vocab}-token "
                        f"vocabulary but the student's has {config.model.vocab_size}; unset data.vocab to use the "
                        "teacher's")
    config.data.vocab = str(vocab_path)
    validation.check(config)
    if config.data.get("corpora"):  # a frozen config holds no dicts in tuples: recorded as (path, weight) pairs
        config.data.corpora = tuple((entry["path"], float(entry["weight"])) for entry in config.data.corpora)
    models.build(config.model)  # the network's own checks (its config's), before any corpus is tokenized
    return ml_collections.FrozenConfigDict(config), tokenizer, start, teacher


def corpora(data: ml_collections.ConfigDict) -> list[tuple[str, float]]:
    """The corpora pretraining reads and their weights: `data.corpora` (as `resolved` records
    it, (path, weight) pairs), else `data.corpus` (unset: the embedded corpus) alone."""
    return [(str(path), float(weight)) for path, weight in data.get("corpora") or ()] or [
        (str(data.corpus or embedded_corpus_path()), 1.0)]


def shuffled_data(config: ml_collections.ConfigDict, tokenizer: Any, docs: list[dict[str, Any]],
                  mixture: list[tuple[str, float]]) -> tuple[pipeline.PretrainingStream, list[dict[str, np.ndarray]]]:
    """Every transform but a contiguous one: the stream of shuffled rows mixed from the corpora
    (`docs`: each one's splits; `mixture`: (path, weight) of each) and fixed held-out batches
    (this process's rows). A mixture's realised shares are logged every `log_every` steps."""
    weights = [w for _, w in mixture]
    stream = pipeline.PretrainingStream(
        [d["train"] for d in docs],
        tokenizer,
        config.data,
        batch_size=config.batch_size,
        seed=config.seed,
        weights=weights,
        names=[path for path, _ in mixture],
        report=log,
        report_every=config.log_every,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    rows = stream.rows
    evals = [
        {k: v[rows] for k, v in b.items()}
        for b in pipeline.eval_batches(
            [d["validation"] for d in docs], tokenizer, config.data, batch_size=config.batch_size,
            num_batches=config.eval_batches, seed=config.seed, weights=weights,
        )
    ]
    return stream, evals


def contiguous_data(config: ml_collections.ConfigDict, transform: transforms.Transform,
                    docs: dict[str, Any]) -> tuple[lanes.LanesStream, list[dict[str, np.ndarray]]]:
    """A contiguous transform's lanes (`bertology.data.lanes`): the stream and held-out lanes
    (this process's rows, in order)."""
    stream = lanes.LanesStream(transform, docs["train"], batch_size=config.batch_size, seed=config.seed,
                               process_index=jax.process_index(), process_count=jax.process_count())
    evals = [{k: v[stream.rows] for k, v in b.items()}
             for b in lanes.eval_batches(transform, docs["validation"], batch_size=config.batch_size,
                                         num_batches=config.eval_batches, seed=config.seed)]
    return stream, evals


def first_carry(family: models.Family, model_config: ml_collections.ConfigDict, batch_size: int) -> Any:
    """The family's initial carry for this model block on contiguous lanes; None if it carries
    nothing (no `initial_carry`, or that says so), so a stateless family reads lanes as plain rows."""
    return None if family.initial_carry is None else family.initial_carry(model_config, batch_size)


def eval_model_block(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict | None:
    """The model block held-out evaluation builds its network from: `model` with the set (not
    None) entries of the config's `eval` block over it, the same parameters under other settings
    (a longer memory); None when the config sets none, so evaluation runs the training network."""
    overrides = {k: v for k, v in (config.get("eval") or {}).items() if v is not None}
    if not overrides:
        return None
    block = ml_collections.ConfigDict(config.model.to_dict())
    block.update(overrides)
    return block


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Pretrain per `config` in `workdir` (a local path or gs://...), resuming from its latest
    checkpoint. Returns {history, state, step, preempted}."""
    with prepared(config, workdir) as (run, stream, evals):
        return run.fit(stream, config.total_steps, run.evaluator(evals) if config.eval_every else None)


def evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, float]:
    """The held-out metrics of `workdir`'s latest checkpoint, evaluated per `config` (that run's
    config; its `eval` block may differ, e.g. `--config.eval.mem_len` for a longer memory) without
    training further: one run's parameters compared under several evaluation settings."""
    if not (epath.Path(workdir) / "config.json").exists():
        raise UserError(f"{workdir} is not a bertology run (no config.json); pass the --workdir of a pretraining run")
    with prepared(config, workdir) as (run, _, evals):
        if run.data_state is None:
            raise UserError(f"{workdir} holds no checkpoint to evaluate; train it first or pass another workdir")
        return run.evaluator(evals)(run.state["params"])


@contextlib.contextmanager
def prepared(config: ml_collections.ConfigDict,
             workdir: str | pathlib.Path) -> Iterator[tuple[run_lib.Run, Any, list[dict[str, np.ndarray]]]]:
    """The set-up run of `config` in `workdir` (resumed from its latest checkpoint, else fresh),
    its training stream and its held-out batches: what `train` and `evaluate` share."""
    workdir = epath.Path(workdir)
    config, tokenizer, start, teacher = resolved(config)
    vocab_path = pathlib.Path(config.data.vocab)
    mixture = corpora(config.data)
    docs = [corpus_lib.load_documents(corpus, tokenizer, vocab_path, config.data.cache_dir, log=log,
                                      progress=jax.process_index() == 0,  # documents stay on disk, read by index
                                      text_column=config.data.get("text_column", "text"))
            for corpus, _ in mixture]
    family = models.family(config.model.family)
    transform = transforms.make(config.data, tokenizer)
    eval_block = eval_model_block(config)
    eval_model, eval_carry = None if eval_block is None else models.build(eval_block), None
    if transform.contiguous:
        (stream, evals), carry = contiguous_data(config, transform, docs[0]), first_carry(family, config.model,
                                                                                       config.batch_size)
        if eval_block is not None:
            eval_carry = first_carry(family, eval_block, config.batch_size)
    else:
        (stream, evals), carry = shuffled_data(config, tokenizer, docs, mixture), None
    start_position = stream.get_state()
    first = next(stream)
    stream.set_state(start_position)

    def start_params(fresh: Any) -> Any:
        """A new run's parameters: the init checkpoint's, else (a distillation student) the teacher's
        layers where the family states how (`from_teacher`)."""
        if start is not None:
            log(f"starting from the parameters of {config.init_checkpoint}")
            return start(fresh)
        params = family.from_teacher(teacher.params, fresh)
        check_shapes(params, fresh, teacher.source)
        log(f"starting from the layers of the teacher {config.teacher_checkpoint}")
        return params

    starts = start is not None or (teacher is not None and family.from_teacher is not None)
    with run_lib.setup(
        config, workdir,
        model=models.build(config.model),
        objective=objectives.get(config.objective),
        example={k: v[:1] for k, v in first.items() if k != CARRY_RESET},
        optimizer=lambda _: optimizer_lib.make(config.optimizer, config.total_steps),
        start_params=start_params if starts else None,
        teacher=teacher,
        carry=carry,
        eval_model=eval_model,
        eval_carry=eval_carry,
    ) as run:
        log(f"pretraining {config.model.family} ({sum(x.size for x in jax.tree.leaves(run.state['params'])) / 1e6:.2f}M "
            f"params), batch {config.batch_size}x{config.data.max_seq_length}")
        yield run, stream, evals
