"""A frozen teacher beside the student (knowledge distillation: DistilBERT, and later TinyBERT).

Where the teacher lives, and why. Its parameters are *not* part of the train state: the state is
what the optimizer updates and what every checkpoint writes, and a teacher is neither. Instead
`bertology.train.run.setup` loads them once (`load`), places them on the mesh with the same
logical-axis rules as the student's, and passes them to the jitted train and eval steps as an
extra argument that is never donated, never differentiated (gradients are taken with respect to
the student's params only) and never given to the optimizer. A resumed run reloads them from
`config.teacher_checkpoint`, a key that config drift checking guards like any other.

The objective contract stays `loss(params, batch, rng, model)`: with a teacher, `model` is a
`WithTeacher` (the student module, the teacher module and the teacher's parameters), so a
distillation objective reads both networks from the one argument it already has, and objectives
without a teacher are untouched.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import flax.linen as nn
import ml_collections

from bertology import models
from bertology.train.checkpoint import load_params


@dataclasses.dataclass(frozen=True)
class Teacher:
    """A loaded teacher: its module, its parameters (host arrays), and the run config it came with."""

    model: nn.Module
    params: Any
    config: dict[str, Any]
    source: pathlib.Path


@dataclasses.dataclass(frozen=True)
class WithTeacher:
    """The `model` a distillation objective receives: `teacher_params` are traced arrays inside
    the step (an argument of the jitted function, not a constant baked into it)."""

    student: nn.Module
    teacher: nn.Module
    teacher_params: Any


def load(path: str | pathlib.Path) -> Teacher:
    """The teacher in `path`: a pretraining run directory or a `bertology.convert --from hf` import."""
    params, config = load_params(path)
    return Teacher(models.build(ml_collections.ConfigDict(config["model"])), params, config, pathlib.Path(path))
