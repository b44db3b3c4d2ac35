"""The jittable pieces of training: the train state and the train step.

The train state is a plain dict {step, params, opt_state}. The step rewrites only those three
entries and `carry`, and passes any other through untouched, so a family can keep more in it and
have it placed, checkpointed and restored with the rest.

`state["carry"]` (present only for a recurrent family on contiguous data, `bertology.data.lanes`)
is state handed from one batch to the next: a pytree of arrays whose leading axis is the global
batch row. The step zeroes the rows the batch marks with `carry_reset` (a lane's first step of a
pass), hands the rest to the objective as `batch["carry"]`, and keeps the objective's
`Terms.carry`, gradient stopped: backpropagation is truncated at batch boundaries, as
Transformer-XL and bilm-tf train.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.objectives import Objective, Terms

State = dict[str, Any]


CARRY, CARRY_RESET = "carry", "carry_reset"


def with_carry(batch: dict[str, jax.Array], carry: Any) -> dict[str, jax.Array]:
    """The batch as an objective sees it: `carry` under "carry", zeroed in the rows whose
    `carry_reset` is set (the key itself removed: objectives never read it)."""
    batch = dict(batch)
    reset = batch.pop(CARRY_RESET, None)
    if reset is not None:
        keep = reset == 0
        carry = jax.tree.map(lambda c: jnp.where(keep.reshape(-1, *[1] * (c.ndim - 1)), c, jnp.zeros_like(c)), carry)
    return {**batch, CARRY: carry}


def _rows(x: jax.Array, k: int) -> jax.Array:
    """[B, ...] -> [k, B / k, ...]: microbatch i holds rows i, i+k, i+2k, ..."""
    return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def _joined(x: jax.Array) -> jax.Array:
    """The inverse of `_rows`: [k, B / k, ...] -> [B, ...]."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def accumulated_gradients(model: nn.Module, objective: Objective, grad_accum_steps: int) -> Callable:
    """(params, batch, key) -> (grads, metrics) of the whole batch, taken over `grad_accum_steps`
    microbatches (`accumulated_with_carry` without its carry)."""
    grads = accumulated_with_carry(model, objective, grad_accum_steps)
    return lambda params, batch, key: grads(params, batch, key)[:2]


def accumulated_with_carry(model: nn.Module, objective: Objective, grad_accum_steps: int) -> Callable:
    """(params, batch, key) -> (grads, metrics, carry) of the whole batch, taken over
    `grad_accum_steps` microbatches; microbatch i takes rows i, i+k, i+2k, ... so each one is
    spread evenly over the data shards. A `batch["carry"]` is split into the same rows, and the
    microbatches' returned carries re-joined into the full batch's (None without one).

    Each microbatch's loss terms are divided by the full batch's weights, and the microbatch
    gradients summed: the full batch's gradient, whatever each microbatch holds. The full
    batch's weights come from the objective called on the whole batch: they depend on the batch
    alone (the objectives' contract), so XLA drops that call's model computation, which nothing
    reads. Metrics are the microbatches' sums divided once.
    """
    k = grad_accum_steps

    def loss_of(params, batch, key, weights):
        terms = objective.terms(params, batch, key, model)
        return terms.loss_value(weights), terms

    def grads(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[Any, dict[str, jax.Array], Any]:
        weights = objective.terms(params, batch, key, model).weights()
        micro = jax.tree.map(lambda x: _rows(x, k), batch)
        grad_fn = jax.grad(loss_of, has_aux=True)

        def body(acc, xs):
            i, mb = xs
            g, terms = grad_fn(params, mb, jax.random.fold_in(key, i), weights)
            carry, terms = terms.carry, Terms(terms.loss, terms.means)
            return jax.tree.map(jnp.add, acc, (g, terms)), carry

        first = jax.tree.map(lambda x: x[0], micro)
        g_shape, t_shape = jax.eval_shape(grad_fn, params, first, key, weights)
        zeros = jax.tree.map(jnp.zeros_like, (g_shape, Terms(t_shape.loss, t_shape.means)))
        (g, terms), carries = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
        return g, objective.metrics(terms), jax.tree.map(_joined, carries)

    return grads


def make_train_step(
    model: nn.Module,
    loss_fn: Callable,
    tx: optax.GradientTransformation,
    lr: optax.Schedule,
    grad_accum_steps: int,
) -> Callable:
    """(state, batch, key) -> (state, metrics): one optimizer step on the whole batch.

    `loss_fn` is an `objectives.Objective`. Without accumulation any function (params, batch,
    rng, model) -> (loss, metrics) will do (the benchmark's Hugging Face reference is one); with
    `grad_accum_steps` > 1, or a state with a carry, see `accumulated_with_carry`. The dropout key
    of step s is fold_in(key, s) (and of microbatch i, fold_in of that, i).
    """
    accumulated = accumulated_with_carry(model, loss_fn, grad_accum_steps)

    def plain(params, batch, key):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key, model)
        return grads, metrics, None

    def step(state: State, batch: dict[str, jax.Array], key: jax.Array) -> tuple[State, dict]:
        key = jax.random.fold_in(key, state["step"])
        params = state["params"]
        carried = CARRY in state
        if carried:
            batch = with_carry(batch, state[CARRY])
        grads_of = accumulated if carried or grad_accum_steps > 1 else plain
        grads, metrics, carry = grads_of(params, batch, key)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_state = {**state, "step": state["step"] + 1, "params": optax.apply_updates(params, updates),
                     "opt_state": opt_state}
        if carried:
            if carry is None:
                raise ValueError("the train state carries state across batches but the objective returned no "
                                 "Terms.carry")
            new_state[CARRY] = jax.lax.stop_gradient(carry)
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
