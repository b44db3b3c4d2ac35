"""Objectives picked by name: `config.objective` names a module here that defines `loss`.

Every `loss(params, batch, rng, model) -> (scalar, metrics)` is stateless; `rng=None` is evaluation.
"""

from __future__ import annotations

import importlib
from typing import Callable

from bertology.errors import UserError


def get(name: str) -> Callable:
    try:
        return importlib.import_module(f"bertology.objectives.{name}").loss
    except ModuleNotFoundError:
        raise UserError(f"unknown objective {name!r}; it must name a module in bertology/objectives/") from None
