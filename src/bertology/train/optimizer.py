"""Optimizers and learning-rate schedules from the config's `optimizer` block.

BERT's recipe: AdamW (b1 0.9, b2 0.999, eps 1e-6) with weight decay 0.01 applied to every weight
but LayerNorm parameters and biases, linear warmup then linear decay to zero, global-norm
clipping at 1.0. GPT's recipes decay along a cosine instead (`schedule`, `end_learning_rate_fraction`).

Fine-tuning adds two options. Layer-wise learning-rate decay (ELECTRA, Clark et al. 2020) scales
each parameter's update by decay^(num_layers + 2 - depth): embeddings are depth 0, layer i is
depth i + 1, and everything else (task head, pooler, scalar mix) is depth num_layers + 2, i.e.
the full rate -- as ELECTRA's `_get_layer_lrs` assigns them. Which layer a parameter is in is the
trunk family's `layer_index` (`bertology.models.layout`); a scanned stack's parameters get one
factor per layer along their leading axis. A trainable mask freezes the rest:
frozen parameters get exactly zero updates and no Adam state, and do not count towards clipping.
"""

from __future__ import annotations

from typing import Any

import jax
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
    (`'cosine'`, GPT)."""
    total_steps = cfg.get("schedule_steps") or total_steps
    warmup = min(cfg.warmup_steps, total_steps)
    end = cfg.learning_rate * cfg.get("end_learning_rate_fraction", 0.0)
    kind = cfg.get("schedule", "linear")
    decay_steps = max(total_steps - warmup, 1)
    if kind == "linear":
        decay = optax.linear_schedule(cfg.learning_rate, end, decay_steps)
    elif kind == "cosine":
        decay = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps, alpha=end / cfg.learning_rate)
    else:
        raise UserError(f"optimizer.schedule={kind!r} is unknown; use 'linear' or 'cosine'")
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.learning_rate, max(warmup, 1)), decay],
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


def scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    """Multiply each update by its own constant (the per-layer learning-rate factors)."""

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u, m: u * m, updates, multipliers), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def make(
    cfg: ml_collections.ConfigDict, total_steps: int, *, trainable: Any = None, multipliers: Any = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and its schedule. `trainable` (a tree of bools shaped like the params)
    freezes the False leaves; `multipliers` (a tree of floats) scales each one's updates."""
    lr = schedule(cfg, total_steps)
    if cfg.name == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    elif cfg.name == "lamb":  # ALBERT's large-batch optimizer: Adam with a per-layer trust ratio
        opt = optax.lamb(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    else:
        raise UserError(f"optimizer.name={cfg.name!r} is unknown; use 'adamw' or 'lamb'")
    tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    if multipliers is not None:
        tx = optax.chain(tx, scale_by_tree(multipliers))
    if trainable is not None:
        labels = jax.tree.map(lambda t: "train" if t else "frozen", trainable)
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, lr
