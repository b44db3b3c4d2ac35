"""Pruning while fine-tuning: unstructured magnitude pruning and attention-head pruning.

Both are an optimizer wrapper (`pruned`), so the masks are optimizer state: checkpointed and
restored with the run, and applied inside the jitted step after every update (a pruned weight is
set back to 0 whatever the inner optimizer proposed, so it stays 0).

- `magnitude` (Zhu & Gupta 2017): the weights with the smallest |w| are masked, the sparsity
  rising from 0 at `begin` to `sparsity` at `end` on the cubic schedule
  s_t = s_f · (1 - (1 - (t - begin)/(end - begin))^3), masks recomputed every `every` steps, and
  a mask only ever loses entries. `scope` = global (one threshold over all prunable matrices) or
  per_matrix (each matrix at the same sparsity; each layer's slice of a scanned stack is a matrix
  of its own). Prunable: the encoder layers' kernels (Q, K, V, attention output, FFN, MobileBERT's
  bottlenecks), found by the trunk family's `layer_index` (`bertology.models.layout`);
  embeddings, norms, biases, the pooler and the head stay dense.
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
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertology.errors import UserError
from bertology.models import layout

Array = jax.Array


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


def prunable(params: Any, layer_index: layout.LayerIndex) -> Any:
    """Bools shaped like `params`: the kernels inside the encoder's layers."""
    def pick(path, leaf):
        names = layout.keys(path)
        where = layout.in_layers(names, layer_index)
        return names[-1] == "kernel" and (where == layout.STACKED or (isinstance(where, int) and where >= 0))
    return jax.tree_util.tree_map_with_path(pick, params)


def _stacked(params: Any, layer_index: layout.LayerIndex) -> Any:
    """Bools shaped like `params`: leaves of a scanned stack (leading axis = layer)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: layout.in_layers(layout.keys(path), layer_index) == layout.STACKED, params)


def _attention_layers(params: Any, layer_index: layout.LayerIndex) -> list[tuple[str, ...]]:
    """Each layer's self-attention module, as a path under `encoder`."""
    blocks = layout.attention_blocks(params.get("encoder", {}), layer_index)
    if not blocks:
        raise UserError("head pruning reads each layer's attention, and this encoder has none by layer (a scanned "
                        "stack keeps them stacked); fine-tune an unscanned encoder (model.scan_layers=False)")
    return blocks


def _at(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


class PruneState(NamedTuple):
    inner: Any
    masks: Any  # magnitude: a bool per prunable weight (a scalar True elsewhere)
    heads: Array  # heads: [layers, heads] {0., 1.}
    importance: Array  # heads: [layers, heads], accumulated since the last pruning step
    count: Array


def _head_masks(params: Any, heads: Array, layer_index: layout.LayerIndex) -> Any:
    """Parameter masks of the heads still present: Q/K/V kernels [e, h, d] and biases [h, d], W_o [h, d, e]."""
    index = {path: i for i, path in enumerate(_attention_layers(params, layer_index))}

    def pick(path, leaf):
        names = layout.keys(path)
        block = next((p for p in index if names[1:1 + len(p)] == p), None) if names[0] == "encoder" else None
        if block is None:
            return jnp.ones((), leaf.dtype)
        row, part = heads[index[block]], names[1 + len(block)]
        if part in ("query", "key", "value"):
            return row[None, :, None] if names[-1] == "kernel" else row[:, None]
        if part == "output" and names[-1] == "kernel":
            return row[:, None, None]
        return jnp.ones((), leaf.dtype)

    return jax.tree_util.tree_map_with_path(pick, params)


def _magnitude_masks(weights: Any, where: Any, stacked: Any, target: Array, scope: str, old: Any) -> Any:
    """Masks keeping all but the `target` fraction of smallest |w| among the prunable weights."""
    def keep(w: Array, k: Array) -> Array:
        flat = jnp.sort(jnp.abs(w).ravel())
        threshold = flat[jnp.clip(k - 1, 0, flat.size - 1)]
        return jnp.where(k > 0, jnp.abs(w) > threshold, True)

    def per_matrix(w: Array, s: bool) -> Array:
        one = lambda x: keep(x, jnp.floor(target * x.size).astype(jnp.int32))  # noqa: E731
        return jax.vmap(one)(w) if s else one(w)

    if scope == "per_matrix":
        return jax.tree.map(lambda p, w, s, m: per_matrix(w, s) & m if p else m, where, weights, stacked, old)
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


def pruned(inner: optax.GradientTransformation, plan: Plan, layer_index: layout.LayerIndex) -> optax.GradientTransformation:
    """`inner`, then the plan's masks applied to the parameters it produces (module docstring);
    `layer_index` is the trunk family's (`bertology.models.layout`)."""

    def init(params: Any) -> PruneState:
        state = inner.init(params)
        params = nn.meta.unbox(params)  # the masks are replicated, whatever the parameters' sharding
        where = prunable(params, layer_index)
        if plan.kind == "magnitude" and not any(jax.tree.leaves(where)):
            raise UserError("magnitude pruning found no layer kernels in this encoder; its family's layer_index "
                            "(bertology.models.layout) names none of its parameters")
        masks = jax.tree.map(lambda p, w: jnp.ones(w.shape if p else (), bool), where, params)
        shape = (1, 1)  # unused without head pruning (a checkpoint cannot hold an empty array)
        if plan.kind == "heads":
            layers = _attention_layers(params, layer_index)
            shape = (len(layers), _at(params["encoder"], layers[0])["output"]["kernel"].shape[0])
        return PruneState(state, masks, jnp.ones(shape), jnp.zeros(shape), jnp.zeros((), jnp.int32))

    def update(grads: Any, state: PruneState, params: Any = None) -> tuple[Any, PruneState]:
        updates, inner_state = inner.update(grads, state.inner, params)
        step = state.count + 1
        due = (step >= plan.begin) & (step <= plan.end) & ((step - plan.begin) % plan.every == 0)
        target = cubic_sparsity(step, plan)
        proposed = optax.apply_updates(params, updates)
        masks, heads, importance = state.masks, state.heads, state.importance
        if plan.kind == "magnitude":
            where, stacked = prunable(params, layer_index), _stacked(params, layer_index)
            current = jax.tree.map(lambda w, m: w * m, proposed, masks)
            masks = jax.lax.cond(due, lambda: _magnitude_masks(current, where, stacked, target, plan.scope, masks),
                                 lambda: masks)
        elif plan.kind == "heads":
            layers = _attention_layers(params, layer_index)
            gate = jnp.stack([jnp.sum(_at(params["encoder"], n)["output"]["kernel"]
                                      * _at(grads["encoder"], n)["output"]["kernel"], axis=(1, 2)) for n in layers])
            importance = importance + jnp.abs(gate)
            heads = jnp.where(due, _prune_heads(heads, importance, target), heads)
            importance = jnp.where(due, jnp.zeros_like(importance), importance)
            masks = _head_masks(params, heads, layer_index)
        kept = jax.tree.map(lambda w, m: w * m, proposed, masks)
        updates = jax.tree.map(lambda new, old: new - old, kept, params)
        if plan.kind == "heads":
            masks = state.masks  # derived from `heads` at every step; the state keeps its own shape
        return updates, PruneState(inner_state, masks, heads, importance, step)

    return optax.GradientTransformation(init, update)


def sparsity(params: Any, layer_index: layout.LayerIndex) -> float:
    """The fraction of zeros among the prunable weights."""
    chosen = [w for p, w in zip(jax.tree.leaves(prunable(params, layer_index)), jax.tree.leaves(params)) if p]
    return float(sum(int((jnp.asarray(w) == 0).sum()) for w in chosen) / sum(w.size for w in chosen))


def heads_left(params: Any, layer_index: layout.LayerIndex) -> list[int]:
    """Per layer, the heads whose output rows are not all zero (empty for a scanned stack)."""
    return [int((jnp.abs(_at(params["encoder"], n)["output"]["kernel"]).sum(axis=(1, 2)) > 0).sum())
            for n in layout.attention_blocks(params["encoder"], layer_index)]
