"""Optimizers and learning-rate schedules from the config's `optimizer` block.

BERT's recipe: AdamW (b1 0.9, b2 0.999, eps 1e-6) with weight decay 0.01 applied to every weight
but LayerNorm parameters and biases, linear warmup then linear decay to zero, global-norm
clipping at 1.0. GPT's recipes decay along a cosine instead (`schedule`, `end_learning_rate_fraction`);
ULMFiT's slanted triangular rate (Howard & Ruder 2018) climbs from 1/ratio of the peak and falls
back to it (`schedule='slanted_triangular'`, `stlr_ratio`, 32 in the paper).

Fine-tuning adds two options. Layer-wise learning-rate decay (ELECTRA, Clark et al. 2020) scales
each parameter's update by decay^(num_layers + 2 - depth): embeddings are depth 0, layer i is
depth i + 1, and everything else (task head, pooler, scalar mix) is depth num_layers + 2, i.e.
the full rate -- as ELECTRA's `_get_layer_lrs` assigns them. Which layer a parameter is in is the
trunk family's `layer_index` (`bertology.models.layout`); a scanned stack's parameters get one
factor per layer along their leading axis. A trainable mask freezes the rest:
frozen parameters get exactly zero updates and no Adam state, and do not count towards clipping.
Gradual unfreezing (ULMFiT) trains the top layer group first (the task head and everything at
ELECTRA's top depth) and one more group, top down, every `every` steps (`gradually_unfrozen`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertology.errors import UserError
from bertology.models import layout


def decays(name: str) -> bool:
    """Whether the parameter called `name` (the last key of its path) gets weight decay: not a
    norm's `scale` and no bias. BERT's and XLNet's reference optimizers skip every variable whose
    name contains "bias" (`re.search`, `exclude_from_weight_decay`), so the rule is a substring:
    it also spares XLNet's `lm_bias` and `r_*_bias`, the LSTMs' `output_bias` and BART's constant
    `final_logits_bias`, with no family named here."""
    return name != "scale" and "bias" not in name


def decay_mask(params: Any) -> Any:
    """True for parameters that get weight decay (`decays`)."""
    # The last dict key names the parameter (boxed trees add a `.value` attribute after it).
    return jax.tree_util.tree_map_with_path(lambda path, _: decays(layout.keys(path)[-1]), params)


def schedule(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Linear warmup to the peak, then decay to `end_learning_rate_fraction` of it (default 0) at
    total_steps (or `schedule_steps` where set): linear (`schedule='linear'`, BERT) or half a cosine
    (`'cosine'`, GPT); or ULMFiT's slanted triangle (`'slanted_triangular'`), whose warmup starts
    at and whose decay ends at 1/`stlr_ratio` of the peak (its cut is the warmup)."""
    total_steps = cfg.get("schedule_steps") or total_steps
    warmup = min(cfg.warmup_steps, total_steps)
    start, end = 0.0, cfg.learning_rate * cfg.get("end_learning_rate_fraction", 0.0)
    kind = cfg.get("schedule", "linear")
    decay_steps = max(total_steps - warmup, 1)
    if kind == "slanted_triangular":
        start = end = cfg.learning_rate / cfg.get("stlr_ratio", 32.0)
    if kind in ("linear", "slanted_triangular"):
        decay = optax.linear_schedule(cfg.learning_rate, end, decay_steps)
    elif kind == "cosine":
        decay = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps, alpha=end / cfg.learning_rate)
    else:
        raise UserError(f"optimizer.schedule={kind!r} is unknown; use 'linear', 'cosine' or 'slanted_triangular'")
    return optax.join_schedules([optax.linear_schedule(start, cfg.learning_rate, max(warmup, 1)), decay],
                                boundaries=[warmup])


def layer_depth(where: int | str | None, num_layers: int) -> int | np.ndarray:
    """ELECTRA's depth of a parameter at `where` (`layout.in_layers`): one int, or for a scanned
    stack the depths of its layers in order."""
    if where == layout.EMBEDDINGS:
        return 0
    if where == layout.STACKED:
        return np.arange(1, num_layers + 1)
    if isinstance(where, int):
        return where + 1
    return num_layers + 2


def layerwise_multipliers(params: Any, num_layers: int, decay: float, layer_index: layout.LayerIndex) -> Any:
    """decay^(num_layers + 2 - depth) per parameter (a tree shaped like params; a scanned stack's
    leaves get a [num_layers, 1, ...] factor that broadcasts along their layer axis)."""

    def factor(path, leaf):
        depth = layer_depth(layout.in_layers(layout.keys(path), layer_index), num_layers)
        if isinstance(depth, np.ndarray):
            return (decay ** (num_layers + 2 - depth)).reshape(-1, *[1] * (np.ndim(leaf) - 1)).astype(np.float32)
        return decay ** (num_layers + 2 - depth)

    return jax.tree_util.tree_map_with_path(factor, params)


def unfreezing_ranks(params: Any, num_layers: int, layer_index: layout.LayerIndex) -> Any:
    """Each parameter's layer group counted from the top (0: ELECTRA's top depth, the task head and
    pooler; 1: the last layer; ...; the embeddings last), shaped as `layerwise_multipliers`."""
    depths = sorted({num_layers + 2, *range(num_layers + 1)}, reverse=True)

    def rank(path, leaf):
        depth = layer_depth(layout.in_layers(layout.keys(path), layer_index), num_layers)
        if isinstance(depth, np.ndarray):
            return np.array([depths.index(d) for d in depth], np.int32).reshape(-1, *[1] * (np.ndim(leaf) - 1))
        return depths.index(depth)

    return jax.tree_util.tree_map_with_path(rank, params)


class UnfreezingState(NamedTuple):
    step: jax.Array  # optimizer steps taken
    mu: Any
    nu: Any
    steps: Any  # per parameter (per layer of a scanned stack): the steps it has trained, for Adam's bias correction


def gradually_unfrozen(cfg: ml_collections.ConfigDict, lr: optax.Schedule, ranks: Any,
                       every: int) -> optax.GradientTransformation:
    """AdamW (`cfg`'s b1, b2, eps, weight decay) that trains only the layer groups of rank
    <= step // every (`unfreezing_ranks`), after global-norm clipping of their gradients alone.

    A frozen group is left exactly as it is: no update, no weight decay, and no Adam moments or
    steps, so when it thaws its bias correction starts from its own first step, as PyTorch's Adam
    does for a parameter that had no gradient (ULMFiT's fastai sets requires_grad=False). With one
    step count for all, a group thawing at step 1000 would move by about 3× the learning rate on
    its first step (its second moment not yet warmed up but corrected as if it were)."""
    b1, b2, eps, wd = cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay
    clip = optax.clip_by_global_norm(cfg.clip_norm)

    def init(params):
        zeros = lambda x: jnp.zeros_like(x, jnp.float32)  # noqa: E731
        return UnfreezingState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params),
                               jax.tree.map(lambda r: jnp.zeros(np.shape(r), jnp.int32), ranks))

    def update(grads, state, params=None):
        active = jax.tree.map(lambda r: r <= state.step // every, ranks)
        grads = jax.tree.map(lambda g, a: jnp.where(a, g.astype(jnp.float32), 0.0), grads, active)
        grads, _ = clip.update(grads, clip.init(grads))
        steps = jax.tree.map(lambda n, a: n + a.astype(jnp.int32), state.steps, active)
        mu = jax.tree.map(lambda m, g, a: jnp.where(a, b1 * m + (1 - b1) * g, m), state.mu, grads, active)
        nu = jax.tree.map(lambda v, g, a: jnp.where(a, b2 * v + (1 - b2) * g * g, v), state.nu, grads, active)
        rate = lr(state.step)

        def step(m, v, n, a, p, decays):
            n = jnp.maximum(n, 1).astype(jnp.float32)
            u = (m / (1 - b1 ** n)) / (jnp.sqrt(v / (1 - b2 ** n)) + eps) + (wd * p if decays else 0.0)
            return jnp.where(a, -rate * u, 0.0).astype(p.dtype)

        updates = jax.tree.map(step, mu, nu, steps, active, params, decay_mask(params))
        return updates, UnfreezingState(state.step + 1, mu, nu, steps)

    return optax.GradientTransformation(init, update)


def scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    """Multiply each update by its own constant (the per-layer learning-rate factors)."""

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u, m: u * m, updates, multipliers), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def make(
    cfg: ml_collections.ConfigDict, total_steps: int, *, trainable: Any = None, multipliers: Any = None,
    unfreezing: tuple[Any, int] | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and its schedule. `trainable` (a tree of bools shaped like the params)
    freezes the False leaves; `multipliers` (a tree of floats) scales each one's updates;
    `unfreezing` (ranks, every) thaws the layer groups top down (`gradually_unfrozen`)."""
    lr = schedule(cfg, total_steps)
    if unfreezing is not None and cfg.name != "adamw":
        raise UserError(f"gradual unfreezing runs AdamW, not {cfg.name}; set optimizer.name='adamw'")
    if unfreezing is not None:
        opt = gradually_unfrozen(cfg, lr, *unfreezing)
    elif cfg.name == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    elif cfg.name == "lamb":  # ALBERT's large-batch optimizer: Adam with a per-layer trust ratio
        opt = optax.lamb(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    elif cfg.name == "adamax":  # MT-DNN's (Liu et al. 2019): Adam with the infinity norm of past gradients
        opt = optax.adamaxw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    else:
        raise UserError(f"optimizer.name={cfg.name!r} is unknown; use 'adamw', 'lamb' or 'adamax'")
    tx = opt if unfreezing is not None else optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    if multipliers is not None:
        tx = optax.chain(tx, scale_by_tree(multipliers))
    if trainable is not None:
        labels = jax.tree.map(lambda t: "train" if t else "frozen", trainable)
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, lr
