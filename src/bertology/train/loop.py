"""The one train loop for every family.

A family is (model module, objective module, data stream) picked by name from the config; the
loop only knows that `objective.loss(params, batch, rng, model)` returns (loss, metrics). The
train state is a plain dict {step, params, opt_state} placed on the mesh by the logical rules;
the step is jitted with NamedShardings in and out. Randomness is explicit: the dropout key of
step s is fold_in(seed key, s), and the data stream's position is saved with every checkpoint,
so a resumed run continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import functools
import pathlib
import signal
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertology import models, objectives
from bertology.data import corpus as corpus_lib
from bertology.data import pipeline
from bertology.data.embedded import DEFAULT_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.train import optimizer as optimizer_lib
from bertology.train import sharding
from bertology.train.checkpoint import Checkpointer, check_shapes, load_params
from bertology.train.distributed import any_process
from bertology.train.metrics import MetricsWriter, format_duration, log

State = dict[str, Any]


def make_train_step(
    model: nn.Module,
    loss_fn: Callable,
    tx: optax.GradientTransformation,
    lr: optax.Schedule,
    grad_accum_steps: int,
) -> Callable:
    """(state, batch, key) -> (state, metrics); gradients averaged over `grad_accum_steps` microbatches.

    Microbatch i takes rows i, i+k, i+2k, ... so each one is spread evenly over the data shards.
    """

    def grads_of(params, batch, key):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key, model)
        return grads, metrics

    def step(state: State, batch: dict[str, jax.Array], key: jax.Array) -> tuple[State, dict]:
        key = jax.random.fold_in(key, state["step"])
        params = state["params"]
        if grad_accum_steps == 1:
            grads, metrics = grads_of(params, batch, key)
        else:
            k = grad_accum_steps
            micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)

            def body(acc, xs):
                i, mb = xs
                g, m = grads_of(params, mb, jax.random.fold_in(key, i))
                return jax.tree.map(jnp.add, acc, (g, m)), None

            zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grads_of, params, jax.tree.map(lambda x: x[0], micro), key))
            (grads, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
            grads, metrics = jax.tree.map(lambda x: x / k, (grads, metrics))
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_state = {"step": state["step"] + 1, "params": optax.apply_updates(params, updates), "opt_state": opt_state}
        metrics = {**metrics, "learning_rate": lr(state["step"]), "grad_norm": optax.tree.norm(grads)}
        return new_state, metrics

    return step


def param_init(model: nn.Module, example: dict[str, Any]) -> Callable:
    """key -> fresh parameters, boxed with logical axis names (so `jax.eval_shape` of it gives the
    shardings without allocating anything)."""

    def init(key: jax.Array) -> Any:
        return model.init({"params": key, "dropout": key}, example, deterministic=True)["params"]

    return init


def state_init(model: nn.Module, tx: optax.GradientTransformation, example: dict[str, Any]) -> Callable:
    """key -> a fresh train state {step, params, opt_state}, boxed like `param_init`'s parameters."""
    init_params = param_init(model, example)
    return lambda key: fresh_state(init_params(key), tx)


def fresh_state(params: Any, tx: optax.GradientTransformation) -> State:
    """The train state at step 0 for `params`: a new optimizer state."""
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}


def resolve_vocab(config: ml_collections.ConfigDict) -> tuple[pathlib.Path, Any]:
    """The tokenizer, and config.model.vocab_size checked against (or filled from) it."""
    path = pathlib.Path(config.data.vocab or DEFAULT_VOCAB)
    tokenizer = load_tokenizer(path)
    if config.model.vocab_size is None:
        config.model.vocab_size = tokenizer.vocab_size
    elif config.model.vocab_size != tokenizer.vocab_size:
        raise UserError(
            f"vocab mismatch: model.vocab_size={config.model.vocab_size} but {path} has {tokenizer.vocab_size} tokens; "
            "unset model.vocab_size or use the matching vocab"
        )
    return path, tokenizer


def adopt_init_checkpoint(config: ml_collections.ConfigDict) -> Any | None:
    """With `init_checkpoint` set (a pretraining run or a `bertology.convert --from hf` import),
    take its model block and, unless set, its vocab, and return its parameters to start from.
    A run that already has checkpoints in its workdir resumes from those instead."""
    if not config.get("init_checkpoint"):
        return None
    params, source = load_params(config.init_checkpoint)
    family = source["model"]["family"]
    if family != config.model.family:
        raise UserError(f"init_checkpoint {config.init_checkpoint} is a {family} model but this config pretrains "
                        f"{config.model.family}; use configs/{family}.py")
    config.model = ml_collections.ConfigDict(source["model"])
    if config.data.vocab is None:
        config.data.vocab = source["data"]["vocab"]
    return params


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


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Pretrain per `config` in `workdir` (a local path or gs://...), resuming from its latest
    checkpoint. Returns a summary."""
    workdir = epath.Path(workdir)
    config = ml_collections.ConfigDict(config.to_dict())  # our own copy: vocab_size may be filled in
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.rules_for(config.mesh)
    init_params = adopt_init_checkpoint(config)
    vocab_path, tokenizer = resolve_vocab(config)
    config.data.vocab = str(vocab_path)
    write_config(config, workdir)
    corpus = config.data.corpus or embedded_corpus_path()
    docs = corpus_lib.load_documents(corpus, tokenizer, vocab_path, config.data.cache_dir, log=log)
    if config.batch_size % config.grad_accum_steps:
        raise UserError(f"batch_size {config.batch_size} is not divisible by grad_accum_steps {config.grad_accum_steps}")
    stream = pipeline.PretrainingStream(
        docs["train"],
        tokenizer,
        config.data,
        batch_size=config.batch_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    rows = stream.rows
    evals = [
        {k: v[rows] for k, v in b.items()}
        for b in pipeline.eval_batches(
            docs["validation"], tokenizer, config.data, batch_size=config.batch_size,
            num_batches=config.eval_batches, seed=config.seed,
        )
    ]
    model = models.build(config.model)
    loss_fn = objectives.get(config.objective)
    tx, lr = optimizer_lib.make(config.optimizer, config.total_steps)
    key = jax.random.key(config.seed)

    first = next(stream)
    stream.set_state({"pass": 0, "offset": 0, "step": 0})
    example = {k: v[:1] for k, v in first.items()}

    init_boxed = state_init(model, tx, example)
    with sharding.activate(mesh, rules):
        boxed = jax.eval_shape(init_boxed, key)
        state_shardings = sharding.logical_shardings(boxed, mesh, rules)
        abstract = sharding.abstract_arrays(boxed, state_shardings)
        checkpointer = Checkpointer(workdir, config.keep_checkpoints)
        latest = checkpointer.latest_step()
        if latest is None and init_params is not None:
            check_shapes(init_params, abstract["params"], pathlib.Path(config.init_checkpoint))
            state = jax.jit(lambda p: fresh_state(p, tx), out_shardings=state_shardings)(init_params)
            log(f"starting from the parameters of {config.init_checkpoint}")
        elif latest is None:
            init = jax.jit(lambda k: nn.meta.unbox(init_boxed(k)), out_shardings=state_shardings)
            state = init(key)
        else:
            state, data_state = checkpointer.restore(latest, abstract)
            stream.set_state(data_state)
            log(f"resumed from {checkpointer.directory / str(latest)} at step {latest}")

        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        batch_sharding = sharding.batch_sharding(mesh, rules)
        train_step = jax.jit(
            make_train_step(model, loss_fn, tx, lr, config.grad_accum_steps),
            in_shardings=(state_shardings, batch_sharding, replicated),
            out_shardings=(state_shardings, replicated),
            donate_argnums=(0,),
        )
        eval_step = jax.jit(
            lambda params, batch: loss_fn(params, batch, None, model)[1],
            in_shardings=(state_shardings["params"], batch_sharding),
            out_shardings=replicated,
        )

        def evaluate(params) -> dict[str, float]:
            ms = [jax.device_get(eval_step(params, sharding.shard_batch(b, mesh, rules))) for b in evals]
            return {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}

        writer = MetricsWriter(workdir)
        preemption = Preemption()
        step = int(jax.device_get(state["step"]))
        tokens_per_step = config.batch_size * config.data.max_seq_length
        history: list[dict[str, float]] = []
        pending: list[dict] = []
        t_last, step_last = time.time(), step
        stop = False
        log(
            f"training {config.model.family} ({sum(x.size for x in jax.tree.leaves(state['params'])) / 1e6:.2f}M params) "
            f"on {jax.device_count()} device(s), mesh {dict(mesh.shape)}, steps {step}->{config.total_steps}, "
            f"batch {config.batch_size}x{config.data.max_seq_length}"
        )
        try:
            while step < config.total_steps:
                batch = sharding.shard_batch(next(stream), mesh, rules)
                state, metrics = train_step(state, batch, key)
                step += 1
                pending.append(metrics)
                log_now = step % config.log_every == 0 or step == config.total_steps
                # Agreeing on a stop is a blocking cross-host collective: one process checks its flag
                # every step, several only at log steps, where the loop waits for the device anyway.
                stop = any_process(preemption.requested) if log_now or jax.process_count() == 1 else False
                if log_now or stop:
                    rows_ = jax.device_get(pending)
                    pending = []
                    for i, m in enumerate(rows_):
                        s = step - len(rows_) + i + 1
                        m = {k: float(v) for k, v in m.items()}
                        writer.write(s, m)
                        history.append({"step": s, **m})
                    now = time.time()
                    rate = (step - step_last) / max(now - t_last, 1e-9)
                    m = history[-1]
                    log(
                        f"step {step}/{config.total_steps} | loss {m['loss']:.4f} | mlm_acc {m.get('mlm_accuracy', 0):.3f}"
                        + "".join(f" | {k[:-9]}_acc {m[k]:.3f}" for k in m if k.endswith("_accuracy") and k != "mlm_accuracy")
                        + f" | lr {m['learning_rate']:.2e} | {rate * tokens_per_step / 1e3:.1f}k tok/s"
                        + f" | eta {format_duration((config.total_steps - step) / max(rate, 1e-9))}"
                    )
                    t_last, step_last = now, step
                    writer.flush()
                if config.eval_every and (step % config.eval_every == 0 or step == config.total_steps):
                    ev = evaluate(state["params"])
                    writer.write(step, ev, prefix="eval_")
                    log(f"eval @ {step}: " + " | ".join(f"{k} {v:.4f}" for k, v in ev.items()))
                if step % config.checkpoint_every == 0 or step == config.total_steps or stop:
                    checkpointer.save(step, state, stream.get_state())
                if stop:
                    log(f"SIGTERM: checkpoint written at step {step}; rerun the same command to resume")
                    break
        finally:
            checkpointer.wait()
            checkpointer.close()
            writer.close()
            preemption.restore()
    return {"history": history, "state": state, "step": step, "preempted": stop}
