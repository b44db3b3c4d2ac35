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
import fcntl
import hashlib
import os
import pathlib
import shutil
from typing import Any

import flax.linen as nn
import ml_collections

from bertology import models
from bertology.errors import UserError
from bertology.interop import import_hf
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


def converted_hf(hf_dir: str | pathlib.Path) -> pathlib.Path:
    """The Hugging Face checkpoint in `hf_dir` as a run directory a config can name as its
    `teacher_checkpoint`, converted on first use into $BERTOLOGY_CACHE/converted/.

    Why a cache rather than a manual `bertology.convert` step: a recipe whose teacher ships as HF
    files (configs/minilm_student.py) then runs with one command, and every run and resume names
    the same directory. It is keyed by the bytes of every file in `hf_dir`, so changed weights
    convert anew; a lock makes concurrent first uses convert once, and a directory left half
    written by a crash is redone."""
    hf_dir = pathlib.Path(hf_dir)
    files = sorted(f for f in hf_dir.rglob("*") if f.is_file())
    if not (hf_dir / "config.json").is_file():
        raise UserError(f"{hf_dir} holds no Hugging Face config.json; pass the directory of a saved HF model")
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(hf_dir)).encode() + b"\0")
        with f.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 22), b""):
                digest.update(chunk)
    root = pathlib.Path(os.environ.get("BERTOLOGY_CACHE", "~/.cache/bertology")).expanduser() / "converted"
    target = root / f"{hf_dir.absolute().parent.name}-{hf_dir.name}-{digest.hexdigest()[:16]}"
    done = target / "CONVERTED"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            import_hf(hf_dir, target)
            done.write_text(str(hf_dir.absolute()) + "\n")
    return target
