"""One package per family: `families/<name>/` holds its network (`model.py`, which states the
family's `Family` record), its own pretraining objective where it has one (`objective.py`,
found by `bertology.objectives.get` under the family's name), its own data transforms where it
has them (`data.py`, whose `@register("name")` classes `bertology.data.transforms.lookup` finds
by data.objective), and `__init__.py`, which exposes the record as `FAMILY` for
`bertology.models.family(name)`.

Shared code (the core in `bertology.models`, training, data, generation, interop) never imports
a family package; it asks the record (`tests/test_boundary.py`), or collects what the families
contribute to a registry through `contributions`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import types


@functools.cache
def contributions(module: str) -> tuple[types.ModuleType, ...]:
    """Every family's `<module>` (`data`, `interop`) that exists, imported once, in package order:
    how a shared registry (data transforms, Hugging Face records) finds the families' entries
    without naming a family."""
    found = []
    for package in pkgutil.iter_modules(__path__):
        name = f"{__name__}.{package.name}.{module}"
        if package.ispkg and importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name))
    return tuple(found)
