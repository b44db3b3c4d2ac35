"""Pruning while fine-tuning: unstructured magnitude pruning and attention-head pruning.

Both are an optimizer wrapper (`pruned`), so the masks are optimizer state: checkpointed and
restored with the run, and applied inside the jitted step after every update (a pruned weight is
set back to 0 whatever the inner optimizer proposed, so it stays 0).

- `magnitude` (Zhu & Gupta 2017): the weights with the smallest |w| are masked, the sparsity
  rising from 0 at `begin` to `sparsity` at `end` on the cubic schedule
  s_t = s_f · (1 - (1 - (t - begin)/(end - begin))^3), masks recomputed every `every` steps, and
  a mask only ever loses entries. `scope` = global (one threshold over all prunable matrices) or
  per_matrix (each matrix at the same sparsity). Prunable: the encoder layers' kernels (Q, K, V,
  attention output, FFN); embeddings, norms, biases, the pooler and the head stay dense.
- `heads` (Michel et al. 2019): head h of layer l matters by |∂L/∂ξ_{l,h}|, ξ a gate on its
  output. Gating head h scales the output projection's rows W_o[h], so ∂L/∂ξ_h = Σ W_o[h] · ∂L/∂W_o[h]
  at ξ = 1: read from the gradient the step already has. Each step adds |that| (per batch, the
  paper takes it per example) to an importance table; at a pruning step each layer's scores are
  normalised by their l2 norm (the paper's §4.2), the lowest-scoring heads still present are
  pruned until the schedule's fraction of all heads is reached, and the table restarts. A pruned
  head's query, key and value kernels and biases and its rows of W_o are masked.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.errors import UserError

Array = jax.Array
_BLOCK = re.compile(r"(attention|ffn)_(\d+)$")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to prune and when (steps of the run); validation.py checks each key, this the steps they make."""

    kind: str = "none"
    sparsity: float = 0.0  # final fraction of prunable weights (magnitude) or of all heads (heads)
    scope: str = "global"
    begin: int = 0
    end: int = 0
    every: int = 10

    def __post_init__(self):
        if self.kind != "none" and not (0 <= self.begin <= self.end and self.every >= 1):
            raise UserError(f"prune steps begin={self.begin}, end={self.end}, every={self.every} are not "
                            "0 <= begin <= end with every >= 1; set prune.begin_fraction <= prune.end_fraction")


def cubic_sparsity(step: Array, plan: Plan) -> Array:
    """Zhu & Gupta's schedule (initial sparsity 0): the target sparsity after `step` steps."""
    span = max(plan.end - plan.begin, 1)
    t = jnp.clip((step - plan.begin) / span, 0.0, 1.0)
    return plan.sparsity * (1.0 - (1.0 - t) ** 3)


def _names(path: tuple) -> list[str]:
    return [getattr(p, "key", None) for p in path]


def prunable(params: Any) -> Any:
    """Bools shaped like `params`: the encoder layers' kernels."""
    def pick(path, leaf):
        names = _names(path)
        return (names[0] == "encoder" and names[-1] == "kernel" and len(names) >= 3
                and _BLOCK.match(str(names[1])) is not None)
    return jax.tree_util.tree_map_with_path(pick, params)


def _attention_layers(params: Any) -> list[str]:
    encoder = params.get("encoder", {})
    if "layers" in encoder:
        raise UserError("head pruning reads each layer's attention; fine-tune an unscanned encoder "
                        "(model.scan_layers=False)")
    return sorted((k for k in encoder if k.startswith("attention_")), key=lambda k: int(k.split("_")[1]))


class PruneState(NamedTuple):
    inner: Any
    masks: Any  # magnitude: a bool per prunable weight (a scalar True elsewhere)
    heads: Array  # heads: [layers, heads] {0., 1.}
    importance: Array  # heads: [layers, heads], accumulated since the last pruning step
    count: Array


def _head_masks(params: Any, heads: Array) -> Any:
    """Parameter masks of the heads still present: Q/K/V kernels [e, h, d] and biases [h, d], W_o [h, d, e]."""
    index = {name: i for i, name in enumerate(_attention_layers(params))}

    def pick(path, leaf):
        names = _names(path)
        if names[0] != "encoder" or names[1] not in index:
            return jnp.ones((), leaf.dtype)
        row = heads[index[names[1]]]
        if names[2] in ("query", "key", "value"):
            return row[None, :, None] if names[-1] == "kernel" else row[:, None]
        if names[2] == "output" and names[-1] == "kernel":
            return row[:, None, None]
        return jnp.ones((), leaf.dtype)

    return jax.tree_util.tree_map_with_path(pick, params)


def _magnitude_masks(weights: Any, where: Any, target: Array, scope: str, old: Any) -> Any:
    """Masks keeping all but the `target` fraction of smallest |w| among the prunable weights."""
    def keep(w: Array, k: Array) -> Array:
        flat = jnp.sort(jnp.abs(w).ravel())
        threshold = flat[jnp.clip(k - 1, 0, flat.size - 1)]
        return jnp.where(k > 0, jnp.abs(w) > threshold, True)

    if scope == "per_matrix":
        return jax.tree.map(lambda p, w, m: keep(w, jnp.floor(target * w.size).astype(jnp.int32)) & m if p else m,
                            where, weights, old)
    chosen = [w for p, w in zip(jax.tree.leaves(where), jax.tree.leaves(weights)) if p]
    every = jnp.concatenate([jnp.abs(w).ravel() for w in chosen])
    k = jnp.floor(target * every.size).astype(jnp.int32)
    threshold = jnp.sort(every)[jnp.clip(k - 1, 0, every.size - 1)]
    return jax.tree.map(lambda p, w, m: jnp.where(k > 0, jnp.abs(w) > threshold, True) & m if p else m,
                        where, weights, old)


def _prune_heads(heads: Array, importance: Array, target: Array) -> Array:
    """Heads still present after pruning the lowest layer-normalised importances up to `target` of all."""
    scores = importance / jnp.maximum(jnp.linalg.norm(importance, axis=1, keepdims=True), 1e-12)
    scores = jnp.where(heads > 0, scores, -jnp.inf).ravel()  # pruned heads sort first: they stay pruned
    n = jnp.floor(target * heads.size).astype(jnp.int32)
    rank = jnp.argsort(jnp.argsort(scores))
    return (rank >= n).astype(heads.dtype).reshape(heads.shape) * heads


def pruned(inner: optax.GradientTransformation, plan: Plan) -> optax.GradientTransformation:
    """`inner`, then the plan's masks applied to the parameters it produces (module docstring)."""

    def init(params: Any) -> PruneState:
        state = inner.init(params)
        params = nn.meta.unbox(params)  # the masks are replicated, whatever the parameters' sharding
        where = prunable(params)
        masks = jax.tree.map(lambda p, w: jnp.ones(w.shape if p else (), bool), where, params)
        shape = (1, 1)  # unused without head pruning (a checkpoint cannot hold an empty array)
        if plan.kind == "heads":
            layers = _attention_layers(params)
            shape = (len(layers), params["encoder"][layers[0]]["output"]["kernel"].shape[0])
        return PruneState(state, masks, jnp.ones(shape), jnp.zeros(shape), jnp.zeros((), jnp.int32))

    def update(grads: Any, state: PruneState, params: Any = None) -> tuple[Any, PruneState]:
        updates, inner_state = inner.update(grads, state.inner, params)
        step = state.count + 1
        due = (step >= plan.begin) & (step <= plan.end) & ((step - plan.begin) % plan.every == 0)
        target = cubic_sparsity(step, plan)
        proposed = optax.apply_updates(params, updates)
        masks, heads, importance = state.masks, state.heads, state.importance
        if plan.kind == "magnitude":
            where = prunable(params)
            current = jax.tree.map(lambda w, m: w * m, proposed, masks)
            masks = jax.lax.cond(due, lambda: _magnitude_masks(current, where, target, plan.scope, masks), lambda: masks)
        elif plan.kind == "heads":
            layers = _attention_layers(params)
            gate = jnp.stack([jnp.sum(params["encoder"][n]["output"]["kernel"] * grads["encoder"][n]["output"]["kernel"],
                                      axis=(1, 2)) for n in layers])
            importance = importance + jnp.abs(gate)
            heads = jnp.where(due, _prune_heads(heads, importance, target), heads)
            importance = jnp.where(due, jnp.zeros_like(importance), importance)
            masks = _head_masks(params, heads)
        kept = jax.tree.map(lambda w, m: w * m, proposed, masks)
        updates = jax.tree.map(lambda new, old: new - old, kept, params)
        if plan.kind == "heads":
            masks = state.masks  # derived from `heads` at every step; the state keeps its own shape
        return updates, PruneState(inner_state, masks, heads, importance, step)

    return optax.GradientTransformation(init, update)


def sparsity(params: Any) -> float:
    """The fraction of zeros among the prunable weights."""
    chosen = [w for p, w in zip(jax.tree.leaves(prunable(params)), jax.tree.leaves(params)) if p]
    return float(sum(int((jnp.asarray(w) == 0).sum()) for w in chosen) / sum(w.size for w in chosen))


def heads_left(params: Any) -> list[int]:
    """Per layer, the heads whose output rows are not all zero."""
    return [int((jnp.abs(params["encoder"][n]["output"]["kernel"]).sum(axis=(1, 2)) > 0).sum())
            for n in _attention_layers(params)]
