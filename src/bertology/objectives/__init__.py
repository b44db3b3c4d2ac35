"""Objectives picked by name: `config.objective` names a module here that defines `loss`.

Every `loss(params, batch, rng, model) -> (scalar, metrics)` is stateless; `rng=None` is evaluation.
`config.objective` is a module name, or a dict {name, **options} whose options are keyword
arguments of that `loss` (e.g. ELECTRA's `disc_weight`), so an ablation stays a config change.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Mapping

from bertology.errors import UserError


def get(spec: str | Mapping[str, Any]) -> Callable:
    name, options = (spec, {}) if isinstance(spec, str) else (spec["name"], {k: v for k, v in dict(spec).items() if k != "name"})
    try:
        loss = importlib.import_module(f"bertology.objectives.{name}").loss
    except ModuleNotFoundError:
        raise UserError(f"unknown objective {name!r}; it must name a module in bertology/objectives/") from None
    known = [p.name for p in inspect.signature(loss).parameters.values() if p.kind == p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UserError(f"unknown option(s) {unknown} for objective {name!r}; valid: {known}")
    return functools.partial(loss, **options) if options else loss
