"""One package per family: `families/<name>/` holds its network (`model.py`, which states the
family's `Family` record), its own pretraining objective where it has one (`objective.py`,
found by `bertology.objectives.get` under the family's name), and `__init__.py`, which exposes
the record as `FAMILY` for `bertology.models.family(name)`.

Shared code (the core in `bertology.models`, training, data, generation, interop) never imports
a family package; it asks the record (`tests/test_boundary.py`).
"""
