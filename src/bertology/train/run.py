"""One run setup for pretraining and fine-tuning, and the loop they both run.

`setup` builds everything a run needs from its config and workdir: the mesh and logical-axis
rules, the train state (resumed from the workdir's latest checkpoint, else fresh parameters,
optionally replaced in part or whole by `start_params`, e.g. an `init_checkpoint`) placed on the
mesh by the rules, the jitted train and eval steps, the checkpointer and the metrics writer.
`Run.fit` trains to a step count: one metrics row per step, a log line every `log_every`,
evaluation every `eval_every`, checkpoints with the data position every `checkpoint_every`, and on
SIGTERM a checkpoint and a clean exit. A rerun in the same workdir continues exactly as an
uninterrupted run would: the dropout key of step s is fold_in(seed key, s), and the data
position is saved with every checkpoint.

The config keys read here are the ones every run config has: `seed`, `mesh`, `batch_size`,
`grad_accum_steps`, `log_every`, `eval_every`, `checkpoint_every`, `keep_checkpoints`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import signal
import time
from typing import Any, Callable, Iterator, Protocol

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
from etils import epath

from bertology import validation
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import for_data
from bertology.errors import UserError
from bertology.objectives import Objective
from bertology.train import sharding
from bertology.train.checkpoint import Checkpointer
from bertology.train.distributed import any_process
from bertology.train.metrics import MetricsWriter, format_duration, log
from bertology.train.step import State, fresh_state, make_train_step, param_init

# The step's own metrics; the log line shows lr on its own and leaves grad_norm to the files.
STEP_METRICS = ("learning_rate", "grad_norm")


class Batches(Protocol):
    """Host batches whose position can be saved and restored (PretrainingStream, fine-tuning's
    rows). Every model reads `input_ids`; the log's tokens/s counts its elements."""

    def __next__(self) -> dict[str, np.ndarray]: ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...


def resolve_vocab(config: ml_collections.ConfigDict) -> tuple[pathlib.Path, Any]:
    """The tokenizer, and config.model.vocab_size checked against (or filled from) it."""
    path = pathlib.Path(config.data.vocab or DEFAULT_VOCAB)
    tokenizer = for_data(config.data)
    if config.model.vocab_size is None:
        config.model.vocab_size = tokenizer.vocab_size
    elif config.model.vocab_size != tokenizer.vocab_size:
        raise UserError(
            f"vocab mismatch: model.vocab_size={config.model.vocab_size} but {path} has {tokenizer.vocab_size} tokens; "
            "unset model.vocab_size or use the matching vocab"
        )
    return path, tokenizer


def write_config(config: ml_collections.ConfigDict, workdir: epath.Path) -> None:
    """Keep the resolved config beside the checkpoints: fine-tuning and export rebuild the model from it."""
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))


class Preemption:
    """Turns SIGTERM into a flag the loop checks after each step, so it can checkpoint and exit."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


@dataclasses.dataclass
class Run:
    """A set-up run (see `setup`); `state` is the current train state."""

    config: ml_collections.ConfigDict
    mesh: jax.sharding.Mesh
    rules: sharding.Rules
    key: jax.Array
    objective: Objective
    state: State
    train_step: Callable
    eval_step: Callable
    checkpointer: Checkpointer
    writer: MetricsWriter
    data_state: dict[str, Any] | None  # the data position of the checkpoint resumed from

    @property
    def step(self) -> int:
        return int(jax.device_get(self.state["step"]))

    def shard(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return sharding.shard_batch(batch, self.mesh, self.rules)

    def evaluator(self, batches: list[dict[str, np.ndarray]]) -> Callable[[Any], dict[str, float]]:
        """params -> the objective's metrics over `batches`: every mean's sums added over the
        batches and divided once (so batches weigh by what they hold), then derived metrics."""

        def evaluate(params: Any) -> dict[str, float]:
            terms = [jax.device_get(self.eval_step(params, self.shard(b))) for b in batches]
            total = jax.tree.map(lambda *xs: np.sum(np.asarray(xs, np.float64), axis=0), *terms)
            return {k: float(v) for k, v in self.objective.metrics(total).items()}

        return evaluate

    def fit(self, batches: Batches, total_steps: int, evaluate: Callable[[Any], dict[str, float]] | None = None) -> dict:
        """Train from the current step to `total_steps`. `evaluate(params)` (if given) runs every
        `eval_every` steps and at the last; its numbers are logged and written with an `eval_`
        prefix. Returns {history (this call's steps), state, step, preempted}."""
        c = self.config
        if self.data_state is not None:
            batches.set_state(self.data_state)
        step = self.step
        history: list[dict[str, float]] = []
        pending: list[dict] = []
        t_last, step_last = time.time(), step
        stop = False
        tokens_per_step = 0
        log(f"training steps {step}->{total_steps} on {jax.device_count()} device(s), mesh {dict(self.mesh.shape)}")
        preemption = Preemption()
        try:
            while step < total_steps:
                batch = self.shard(next(batches))
                tokens_per_step = batch["input_ids"].size
                self.state, metrics = self.train_step(self.state, batch, self.key)
                step += 1
                pending.append(metrics)
                log_now = step % c.log_every == 0 or step == total_steps
                # Agreeing on a stop is a blocking cross-host collective: one process checks its flag
                # every step, several only at log steps, where the loop waits for the device anyway.
                stop = any_process(preemption.requested) if log_now or jax.process_count() == 1 else False
                if log_now or stop:
                    rows = jax.device_get(pending)
                    pending = []
                    for i, m in enumerate(rows):
                        s = step - len(rows) + i + 1
                        m = {k: float(v) for k, v in m.items()}
                        self.writer.write(s, m)
                        history.append({"step": s, **m})
                    now = time.time()
                    rate = (step - step_last) / max(now - t_last, 1e-9)
                    log(log_line(history[-1], total_steps, rate * tokens_per_step,
                                 (total_steps - step) / max(rate, 1e-9)))
                    t_last, step_last = now, step
                    self.writer.flush()
                if evaluate is not None and ((c.eval_every and step % c.eval_every == 0) or step == total_steps):
                    ev = evaluate(self.state["params"])
                    self.writer.write(step, ev, prefix="eval_")
                    log(f"eval @ {step}: " + " | ".join(f"{k} {v:.4f}" for k, v in ev.items()))
                if step % c.checkpoint_every == 0 or step == total_steps or stop:
                    self.checkpointer.save(step, self.state, batches.get_state())
                if stop:
                    log(f"SIGTERM: checkpoint written at step {step}; rerun the same command to resume")
                    break
        finally:
            preemption.restore()
        return {"history": history, "state": self.state, "step": step, "preempted": stop}


def log_line(m: dict[str, float], total_steps: int, tokens_per_s: float, seconds_left: float) -> str:
    """`step s/T | loss | the objective's other metrics | lr | tok/s | eta` from a history row."""
    shown = ["loss", *sorted(k for k in m if k not in ("step", "loss", *STEP_METRICS))]
    return (f"step {m['step']}/{total_steps} | " + " | ".join(f"{k} {m[k]:.4f}" for k in shown)
            + f" | lr {m['learning_rate']:.2e} | {tokens_per_s / 1e3:.1f}k tok/s | eta {format_duration(seconds_left)}")


@contextlib.contextmanager
def setup(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    *,
    model: nn.Module,
    objective: Objective,
    example: dict[str, np.ndarray],
    optimizer: Callable[[Any], tuple[optax.GradientTransformation, optax.Schedule]],
    start_params: Callable[[Any], Any] | None = None,
) -> Iterator[Run]:
    """Set up a run of `model` trained on `objective` in `workdir`, with `sharding.activate` in
    force for its duration; checkpoints and metrics are flushed and closed on the way out.

    `example` is one row of model inputs (for shapes). `optimizer(params)` builds (tx, schedule)
    from the abstract parameters (fine-tuning reads their names for its trainable mask and
    layer-wise rates). Without a checkpoint to resume, `start_params(fresh)` may replace the
    fresh parameters (wholly, or e.g. only the encoder); its result is placed like them.
    """
    validation.check(config)
    workdir = epath.Path(workdir)
    write_config(config, workdir)
    mesh, rules = sharding.make_mesh(config.mesh), sharding.rules_for(config.mesh)
    key = jax.random.key(config.seed)
    init_params = param_init(model, example)
    unboxed_init = lambda k: nn.meta.unbox(init_params(k))  # noqa: E731
    with sharding.activate(mesh, rules):
        tx, lr = optimizer(jax.eval_shape(unboxed_init, key))
        boxed = jax.eval_shape(lambda k: fresh_state(init_params(k), tx), key)
        shardings = sharding.logical_shardings(boxed, mesh, rules)
        checkpointer = Checkpointer(workdir, config.keep_checkpoints)
        latest = checkpointer.latest_step()
        data_state = None
        if latest is None:
            params = jax.jit(unboxed_init, out_shardings=shardings["params"])(key)
            if start_params is not None:
                params = jax.device_put(start_params(params), shardings["params"])
            state = jax.jit(lambda p: fresh_state(p, tx), out_shardings=shardings)(params)
        else:
            state, data_state = checkpointer.restore(latest, sharding.abstract_arrays(boxed, shardings))
            log(f"resumed from {checkpointer.directory / str(latest)} at step {latest}")

        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        batch_sharding = sharding.batch_sharding(mesh, rules)
        train_step = jax.jit(
            make_train_step(model, objective, tx, lr, config.grad_accum_steps),
            in_shardings=(shardings, batch_sharding, replicated),
            out_shardings=(shardings, replicated),
            donate_argnums=(0,),
        )
        eval_step = jax.jit(
            lambda params, batch: objective.terms(params, batch, None, model),
            in_shardings=(shardings["params"], batch_sharding),
            out_shardings=replicated,
        )
        writer = MetricsWriter(workdir)
        try:
            yield Run(config, mesh, rules, key, objective, state, train_step, eval_step, checkpointer, writer, data_state)
        finally:
            checkpointer.wait()
            checkpointer.close()
            writer.close()
