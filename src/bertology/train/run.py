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

What a run survives (issue 18), and how:
- Divergence: a step whose loss or gradient norm is NaN or inf is not applied (inside the jitted
  step, by a select: no host sync); the state keeps a count, `skipped_steps`, written with the
  metrics. `max_nonfinite_steps` such steps in a row end the run with one line. No checkpoint is
  written while steps are being skipped (the last one stays that of an applied step), and never
  from a non-finite state (`Checkpointer.save` checks).
- Damaged checkpoints: verified against their checksums on restore; see `checkpoint.py`.
- Two runs on one workdir: `RunLock` (WORKDIR/run.lock).
- Config drift: resuming a workdir whose saved config.json differs from this run's config is
  refused, naming the keys (`check_config_drift`); config.json is written only after the check.
- SIGTERM: the loop checkpoints and stops, then passes the signal on to the handler that was
  installed before `fit` (the CLI's, which exits with status 143; `bertology.cli`).
- metrics.jsonl: a resumed run first drops the rows after the step it resumed from.

The config keys read here are the ones every run config has: `seed`, `mesh`, `batch_size`,
`grad_accum_steps`, `log_every`, `eval_every`, `checkpoint_every`, `keep_checkpoints`, and, with
the defaults below where a config lacks them, `max_nonfinite_steps`, `allow_config_change` and
`checkpoint_every_minutes` (also checkpoint when this much wall-clock time has passed since the
last one; 0: off; on preemptible machines it bounds the work a kill -9 loses).

Carried state (`setup(carry=...)`, see `bertology.train.step`): `state["carry"]` starts from the
given zeros, its rows placed over the data axes like the batch's rows, and is checkpointed and
restored with the rest of the state, so a resumed run continues the same lanes with the same
memory. Evaluation runs its batches in order from a zero carry, carrying it across them.
An evaluation model (`setup(eval_model=..., eval_carry=...)`: the same parameters under other
settings, e.g. Transformer-XL's longer evaluation memory) has its own zero carry, whose shapes
may differ from training's; its rows are placed like the batch's too.

A frozen teacher (`setup(teacher=...)`, see `bertology.train.teacher`) is placed beside the state,
not in it: an extra, undonated argument of the jitted steps, so it is never updated, never
differentiated and never checkpointed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import for_data
from bertology.errors import SIGTERM_RECEIVED, Diverged, UserError
from bertology.files import is_remote, replace_text
from bertology.objectives import Objective, Terms, summed
from bertology.train import sharding
from bertology.train.checkpoint import DIVERGENCE_HINT, Checkpointer, check_shapes
from bertology.train.distributed import any_process
from bertology.train.metrics import MetricsWriter, format_duration, log
from bertology.train.step import CARRY, State, fresh_state, make_train_step, param_init, with_carry
from bertology.train.teacher import Teacher, WithTeacher
from bertology.train.trackers import open_trackers

# The train state's count of steps not applied because their loss or gradient was not finite.
SKIPPED = "skipped_steps"
# The step's own metrics; the log line shows lr on its own and leaves the others to the files.
STEP_METRICS = ("learning_rate", "grad_norm", SKIPPED)
# Defaults for configs that do not set these keys (recipes.pretraining and fine-tuning's do).
MAX_NONFINITE_STEPS = 5
# Keys that may differ between a run and the run it resumes without `allow_config_change`: they
# change what is logged, evaluated or kept, or where the run is placed, never what it computes.
# (total_steps is not among them: the learning-rate schedule is a function of it.)
SAFE_TO_CHANGE = ("log_every", "eval_every", "eval_batches", "eval", "checkpoint_every", "checkpoint_every_minutes",
                  "keep_checkpoints", "max_nonfinite_steps", "allow_config_change", "mesh", "data.cache_dir",
                  "logging")


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
    """Keep the resolved config beside the checkpoints: fine-tuning and export rebuild the model from it.
    Replaced whole (other processes may be reading it for `check_config_drift`; an object-store
    write is whole by itself)."""
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        replace_text(workdir / "config.json", config.to_json_best_effort(indent=2))


def check_config_drift(config: ml_collections.ConfigDict, workdir: epath.Path) -> None:
    """Refuse to resume `workdir` with a config that differs from the one it was trained with
    (its config.json) in any key but `SAFE_TO_CHANGE` and those listed, comma-separated, in
    `config.allow_config_change` (a listed key covers the keys under it: `optimizer` allows
    every optimizer.* change). Otherwise the checkpoint would be continued as a different run
    than the one its config.json describes: another model shape, vocabulary, batch or data."""
    saved_file = workdir / "config.json"
    if not saved_file.exists():
        return
    saved = _flat(json.loads(saved_file.read_text()))
    now = _flat(json.loads(config.to_json_best_effort()))
    listed = [k.strip() for k in str(config.get("allow_config_change") or "").split(",") if k.strip()]
    allowed = (*SAFE_TO_CHANGE, *listed)
    # A key added to the configs since the workdir was written (absent from its config.json) is
    # not drift: the run never had that setting, so upgrading the code mid-run keeps it resumable.
    differ = [k for k in sorted(saved.keys() | now.keys())
              if k in saved and not same_value(saved[k], now.get(k))
              and not any(k == a or k.startswith(a + ".") for a in allowed)]
    if differ:
        shown = ", ".join(f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in differ[:6]) + (" ..." if len(differ) > 6 else "")
        raise UserError(f"{workdir} was trained with a different config ({shown}); resume with the config it was "
                        f"trained with, use a new --workdir, or pass --config.allow_config_change={','.join(differ)} "
                        "if the change is intended")


def same_value(a: Any, b: Any) -> bool:
    """Equal config values, where two paths count as equal when they hold the same bytes: a
    checkout or data directory that moved (another clone, a remounted disk) is not a change."""
    if a == b:
        return True
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    files_a, files_b = _files(a), _files(b)
    if not files_a or len(files_a) != len(files_b):
        return False
    if pathlib.Path(a).is_dir() and [f.name for f in files_a] != [f.name for f in files_b]:
        return False
    if sum(f.stat().st_size for f in files_a) > CONTENT_COMPARE_BYTES:  # a corpus: names and sizes only
        return [f.stat().st_size for f in files_a] == [f.stat().st_size for f in files_b]
    return all(fa.read_bytes() == fb.read_bytes() for fa, fb in zip(files_a, files_b))


CONTENT_COMPARE_BYTES = 256 << 20


def _files(value: str) -> list[pathlib.Path]:
    """The file a path names, or the files directly inside the directory it names; [] otherwise."""
    path = pathlib.Path(value)
    try:
        if path.is_file():
            return [path]
        return sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    except OSError:
        return []


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} for a nested dict (lists and empty dicts stay values)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class RunLock:
    """WORKDIR/run.lock, holding the pid, host and start time of the run using the workdir, so a
    second run on it refuses instead of writing the same checkpoints and metrics.

    A lock is stale, and taken over with a log line, when its process is gone (same host, pid
    not alive) or its heartbeat (refreshed every `HEARTBEAT_S` by a thread of the holder) is older
    than `STALE_S` (a holder on another host that died). The file is created complete with an
    atomic link, so a reader never sees half a lock. Multi-process runs: only process 0 locks.
    Object-storage workdirs (gs://) have no atomic create, and are not locked.
    """

    HEARTBEAT_S = 30.0
    STALE_S = 300.0

    def __init__(self, workdir: epath.Path):
        self.path = pathlib.Path(str(workdir)) / "run.lock"
        self.me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self._thread = threading.Thread(target=self._beat, daemon=True, name="run-lock-heartbeat")
                self._thread.start()
                return
            holder = self.holder()
            why = self.stale_because(holder)
            if why is None:
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
                raise UserError(f"{self.path.parent} is in use by another run (pid {holder['pid']} on {holder['host']}, "
                                f"started {started}); wait for it to finish or use another --workdir")
            log(f"taking over the lock {self.path} of pid {holder.get('pid')} on {holder.get('host')} ({why})")
            self.path.unlink(missing_ok=True)
        raise UserError(f"could not take the lock {self.path}: other runs keep taking it; use another --workdir")

    def holder(self) -> dict[str, Any]:
        """The lock's contents; {} if it is unreadable (only a lock file written by hand can be)."""
        try:
            holder = json.loads(self.path.read_text())
            return holder if isinstance(holder, dict) and {"pid", "host", "started", "heartbeat"} <= holder.keys() else {}
        except (OSError, ValueError):
            return {}

    def stale_because(self, holder: dict[str, Any]) -> str | None:
        """Why `holder`'s lock may be taken over, or None while it is live."""
        if not holder:
            return "it is unreadable"
        if holder["host"] == self.me["host"] and not _alive(int(holder["pid"])):
            return "that process is gone"
        if time.time() - holder["heartbeat"] > self.STALE_S:
            return f"no heartbeat for {format_duration(time.time() - holder['heartbeat'])}"
        return None

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.holder().get("pid") == self.me["pid"] and self.holder().get("host") == self.me["host"]:
            self.path.unlink(missing_ok=True)

    def _create(self) -> bool:
        tmp = self.path.with_name(f"run.lock.{self.me['pid']}.tmp")
        tmp.write_text(json.dumps({**self.me, "heartbeat": time.time()}))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT_S):
            if self.holder().get("started") != self.me["started"]:
                return  # taken over (this process was stopped for longer than STALE_S): not ours to refresh
            tmp = self.path.with_name(f"run.lock.{self.me['pid']}.tmp")
            tmp.write_text(json.dumps({**self.me, "heartbeat": time.time()}))
            os.replace(tmp, self.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def locked(workdir: epath.Path) -> Iterator[None]:
    """Hold `workdir`'s RunLock (process 0 of a local workdir) for the duration."""
    lock = RunLock(workdir) if jax.process_index() == 0 and not is_remote(workdir) else None
    if lock is not None:
        lock.acquire()
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def skip_nonfinite(step_fn: Callable) -> Callable:
    """Wrap a train step so that a step whose loss or gradient norm is NaN or inf leaves params
    and optimizer state as they were (the step counter still advances, as the data did) and adds
    one to state[SKIPPED]. A select inside the jitted step: no host sync, so no cost per step.
    A carry is zeroed by a skipped step: the old one belongs to the batch before, and the new one
    may be what went non-finite, so the lanes start afresh as at a new pass."""

    def step(state: State, batch: dict[str, jax.Array], key: jax.Array) -> tuple[State, dict]:
        new, metrics = step_fn(state, batch, key)
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        kept = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, state)
        kept = {**kept, "step": new["step"], SKIPPED: state[SKIPPED] + (~ok).astype(jnp.int32)}
        if CARRY in new:
            kept[CARRY] = jax.tree.map(lambda c: jnp.where(ok, c, jnp.zeros_like(c)), new[CARRY])
        return kept, {**metrics, SKIPPED: kept[SKIPPED]}

    return step


def initial_state(params: Any, tx: optax.GradientTransformation) -> State:
    """The train state at step 0: `fresh_state` plus the count of skipped steps."""
    return {**fresh_state(params, tx), SKIPPED: jnp.zeros((), jnp.int32)}


class Preemption:
    """Turns SIGTERM into a flag the loop checks after each step, so it can checkpoint and exit;
    then `restore(forward=True)` hands the signal to the handler installed before (if a Python
    one: the CLI's, which exits with its preemption status). A SIGTERM the CLI's handler got
    before the loop, but whose exception Python swallowed (`errors.SIGTERM_RECEIVED`), is a
    request from the start."""

    def __init__(self):
        self.requested = SIGTERM_RECEIVED.is_set()
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def restore(self, forward: bool) -> None:
        signal.signal(signal.SIGTERM, self._previous)
        if forward and callable(self._previous):
            self._previous(signal.SIGTERM, None)


@dataclasses.dataclass(kw_only=True)
class Run:
    """A set-up run (see `setup`); `state` is the current train state."""

    config: ml_collections.FrozenConfigDict
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
    teacher_params: Any = None  # the frozen teacher's parameters as placed on the mesh (None: no teacher)
    zero_carry: Any = None  # the carry evaluation starts from (None: evaluation carries nothing)

    @property
    def step(self) -> int:
        return int(jax.device_get(self.state["step"]))

    def shard(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return sharding.shard_batch(batch, self.mesh, self.rules)

    def evaluator(self, batches: list[dict[str, np.ndarray]]) -> Callable[[Any], dict[str, float]]:
        """params -> the objective's metrics over `batches`: every mean's sums added over the
        batches and divided once (so batches weigh by what they hold), then derived metrics.
        A run that carries state evaluates the batches in order from a zero carry, each handing
        its carry to the next (contiguous held-out lanes)."""

        def evaluate(params: Any) -> dict[str, float]:
            carry, terms = self.zero_carry, []
            for b in batches:
                t, carry = self.eval_step(params, self.shard(b), carry)
                terms.append(jax.device_get(t))
            return {k: float(v) for k, v in self.objective.metrics(summed(terms)).items()}

        return evaluate

    def fit(self, batches: Batches, total_steps: int, evaluate: Callable[[Any], dict[str, float]] | None = None) -> dict:
        """Train from the current step to `total_steps`. `evaluate(params)` (if given) runs every
        `eval_every` steps and at the last; its numbers are logged and written with an `eval_`
        prefix. Returns {history (this call's steps), state, step, preempted}. Raises UserError
        after `max_nonfinite_steps` consecutive non-finite steps."""
        c = self.config
        if self.data_state is not None:
            batches.set_state(self.data_state)
        step = self.step
        limit = c.get("max_nonfinite_steps", MAX_NONFINITE_STEPS)
        skipped, in_a_row = int(jax.device_get(self.state[SKIPPED])), 0
        history: list[dict[str, float]] = []
        pending: list[dict] = []
        t_last, step_last = time.time(), step
        every = c.get("checkpoint_every_minutes", 0) * 60
        last_save = time.monotonic()
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
                save_now = step % c.checkpoint_every == 0 or step == total_steps
                # Agreeing on a stop (or a timed save: hosts' clocks differ) is a blocking cross-host
                # collective: one process checks every step, several only at log steps, where the loop
                # waits for the device anyway.
                agree = log_now or jax.process_count() == 1
                stop = any_process(preemption.requested) if agree else False
                if every and agree and any_process(time.monotonic() - last_save >= every):
                    save_now = True
                if log_now or stop or save_now:  # rows are read before a save: skips are counted first
                    rows = jax.device_get(pending)
                    pending = []
                    for i, m in enumerate(rows):
                        s = step - len(rows) + i + 1
                        m = {k: float(v) for k, v in m.items()}
                        self.writer.write(s, m)
                        history.append({"step": s, **m})
                        in_a_row = in_a_row + 1 if m[SKIPPED] > skipped else 0
                        if m[SKIPPED] > skipped:
                            log(f"step {s}: loss {m['loss']} / gradient norm {m['grad_norm']} not finite; the update "
                                f"was not applied ({int(m[SKIPPED])} skipped so far)")
                        skipped = int(m[SKIPPED])
                        if in_a_row >= limit:
                            self.writer.flush()
                            raise Diverged(
                                f"training diverged: the loss or gradient was NaN or inf at {in_a_row} steps in a row "
                                f"(steps {s - in_a_row + 1}-{s}, none applied; max_nonfinite_steps={limit}); the last "
                                f"checkpoint is step {self.checkpointer.latest_step()}; {DIVERGENCE_HINT}")
                    if log_now or stop:
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
                if (save_now or stop) and in_a_row:  # keep the last checkpoint of an applied step as the last good one
                    log(f"step {step}: no checkpoint while updates are being skipped")
                elif save_now or stop:
                    self.checkpointer.save(step, self.state, batches.get_state())
                    last_save = time.monotonic()
                if stop:
                    log(f"SIGTERM: checkpoint written at step {self.checkpointer.latest_step()}; "
                        "rerun the same command to resume")
                    break
        finally:
            preemption.restore(forward=stop)
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
    teacher: Teacher | None = None,
    carry: Any = None,
    eval_model: nn.Module | None = None,
    eval_carry: Any = None,
) -> Iterator[Run]:
    """Set up a run of `model` trained on `objective` in `workdir`, with `sharding.activate` in
    force for its duration; checkpoints and metrics are flushed and closed on the way out.

    `example` is one row of model inputs (for shapes). `optimizer(params)` builds (tx, schedule)
    from the abstract parameters (fine-tuning reads their names for its trainable mask and
    layer-wise rates). Without a checkpoint to resume, `start_params(fresh)` may replace the
    fresh parameters (wholly, or e.g. only the encoder); its result is placed like them.
    `teacher`: a frozen network whose parameters are placed by the same rules and handed to
    the objective as `WithTeacher(model, teacher.model, params)` (`bertology.train.teacher`).
    `carry`: the initial carried state (host arrays, leading axis the global batch row; the
    family's `initial_carry`) of a recurrent family on contiguous data; None carries nothing.
    `eval_model`: the network held-out evaluation runs on the trained parameters (None: `model`),
    with `eval_carry` its initial carry in `carry`'s form (None: it carries nothing); without an
    `eval_model` evaluation starts from zeros shaped like `carry`.
    `config` is the resolved one (filled in, validated and frozen by the caller: `loop.resolved`,
    the fine-tuning jobs); it is written to the workdir as it is.
    """
    if not isinstance(config, ml_collections.FrozenConfigDict):
        raise TypeError("run.setup takes the resolved, frozen config (ml_collections.FrozenConfigDict)")
    workdir = epath.Path(workdir)
    with locked(workdir), contextlib.ExitStack() as cleanup:
        mesh, rules = sharding.make_mesh(config.mesh), sharding.rules_for(config.mesh)
        key = jax.random.key(config.seed)
        if carry is not None:
            example = {**example, CARRY: jax.tree.map(lambda c: np.asarray(c)[:1], carry)}
        init_params = param_init(model, example)
        unboxed_init = lambda k: nn.meta.unbox(init_params(k))  # noqa: E731
        cleanup.enter_context(sharding.activate(mesh, rules))
        tx, lr = optimizer(jax.eval_shape(unboxed_init, key))
        boxed = jax.eval_shape(lambda k: initial_state(init_params(k), tx), key)
        shardings = sharding.logical_shardings(boxed, mesh, rules)
        batch_sharding = sharding.batch_sharding(mesh, rules)
        if carry is not None:  # rows over the data axes, like the batch's
            carry = jax.tree.map(np.asarray, carry)
            boxed = {**boxed, CARRY: jax.tree.map(lambda c: jax.ShapeDtypeStruct(c.shape, c.dtype), carry)}
            shardings = {**shardings, CARRY: jax.tree.map(lambda _: batch_sharding, carry)}
        checkpointer = Checkpointer(workdir, config.keep_checkpoints)
        cleanup.callback(checkpointer.close)
        if checkpointer.manager.all_steps():
            check_config_drift(config, workdir)  # before config.json is rewritten
        write_config(config, workdir)
        resumed = checkpointer.restore_latest(sharding.abstract_arrays(boxed, shardings))
        data_state = None
        if resumed is None:
            params = jax.jit(unboxed_init, out_shardings=shardings["params"])(key)
            if start_params is not None:
                params = jax.device_put(start_params(params), shardings["params"])
            state = jax.jit(lambda p: initial_state(p, tx),
                            out_shardings={k: v for k, v in shardings.items() if k != CARRY})(params)
            if carry is not None:
                state[CARRY] = jax.device_put(carry, shardings[CARRY])
        else:
            latest, state, data_state = resumed
            log(f"resumed from {checkpointer.directory / str(latest)} at step {latest}")

        frozen, frozen_shardings = (), ()  # the teacher's params: an extra argument of the steps
        if teacher is not None:
            boxed_teacher = jax.eval_shape(param_init(teacher.model, example), key)
            teacher_shardings = sharding.logical_shardings(boxed_teacher, mesh, rules)
            check_shapes(teacher.params, sharding.abstract_arrays(boxed_teacher, teacher_shardings), teacher.source)
            frozen, frozen_shardings = (jax.device_put(teacher.params, teacher_shardings),), (teacher_shardings,)

        def with_teacher(net: nn.Module, *teacher_params: Any) -> Any:
            return WithTeacher(net, teacher.model, teacher_params[0]) if teacher_params else net

        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        jitted_train = jax.jit(
            lambda state, batch, k, *t: skip_nonfinite(
                make_train_step(with_teacher(model, *t), objective, tx, lr, config.grad_accum_steps))(state, batch, k),
            in_shardings=(shardings, batch_sharding, replicated, *frozen_shardings),
            out_shardings=(shardings, replicated),
            donate_argnums=(0,),
        )
        if eval_model is None:
            eval_model, eval_carry = model, None if carry is None else jax.tree.map(np.zeros_like, carry)
        eval_carry_shardings = jax.tree.map(lambda _: batch_sharding, eval_carry)

        def evaluation(params: Any, batch: dict[str, jax.Array], carry: Any, *t: Any) -> tuple[Terms, Any]:
            """One held-out batch's sums, and the carry it hands to the next (None: no carry)."""
            if carry is not None:
                batch = with_carry(batch, carry)
            terms = objective.terms(params, batch, None, with_teacher(eval_model, *t))
            return Terms(terms.loss, terms.means), None if carry is None else terms.carry

        jitted_eval = jax.jit(
            evaluation,
            in_shardings=(shardings["params"], batch_sharding, eval_carry_shardings, *frozen_shardings),
            out_shardings=(replicated, eval_carry_shardings),
        )
        writer = MetricsWriter(workdir, after_step=0 if resumed is None else resumed[0],
                               trackers=open_trackers(config, workdir) if jax.process_index() == 0 else ())
        cleanup.callback(writer.close)
        cleanup.callback(checkpointer.wait)
        yield Run(config=config, mesh=mesh, rules=rules, key=key, objective=objective, state=state,
                  train_step=lambda s, b, k: jitted_train(s, b, k, *frozen),
                  eval_step=lambda p, b, c: jitted_eval(p, b, c, *frozen), checkpointer=checkpointer,
                  writer=writer, data_state=data_state, teacher_params=frozen[0] if frozen else None,
                  zero_carry=None if eval_carry is None else jax.device_put(jax.tree.map(np.asarray, eval_carry),
                                                                            eval_carry_shardings))
