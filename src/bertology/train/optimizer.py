"""Optimizers and learning-rate schedules from the config's `optimizer` block.

BERT's recipe: AdamW (b1 0.9, b2 0.999, eps 1e-6) with weight decay 0.01 applied to every weight
but LayerNorm parameters and biases, linear warmup then linear decay to zero, global-norm
clipping at 1.0.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax

from bertology.errors import UserError

NO_DECAY = ("bias", "scale")  # biases and LayerNorm scales (LayerNorm biases are `bias` too)


def decay_mask(params: Any) -> Any:
    """True for parameters that get weight decay: everything but biases and LayerNorm."""

    def keep(path, _):
        # The last dict key names the parameter (boxed trees add a `.value` attribute after it).
        name = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)][-1]
        return name not in NO_DECAY

    return jax.tree_util.tree_map_with_path(keep, params)


def schedule(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Linear warmup to the peak, then linear decay to 0 at total_steps."""
    warmup = min(cfg.warmup_steps, total_steps)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, cfg.learning_rate, max(warmup, 1)),
            optax.linear_schedule(cfg.learning_rate, 0.0, max(total_steps - warmup, 1)),
        ],
        boundaries=[warmup],
    )


def make(cfg: ml_collections.ConfigDict, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    lr = schedule(cfg, total_steps)
    if cfg.name == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    else:
        raise UserError(f"optimizer.name={cfg.name!r} is unknown; use 'adamw'")
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt), lr
