"""Orbax checkpoints of the train state plus the data iterator's position.

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never leaves a half checkpoint that resume would pick up. Before restoring, shapes are
checked against the current config so a mismatch fails with one line naming the tensor.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bertology.errors import UserError
from bertology.train.metrics import is_remote


class Checkpointer:
    """Saves and restores {step, params, opt_state} with the data position; every process takes
    part (each writes its own shards), and `workdir` may be local or gs://."""

    def __init__(self, workdir: str | pathlib.Path, keep: int):
        workdir = epath.Path(workdir)
        self.directory = (workdir if is_remote(workdir) else workdir.absolute()) / "checkpoints"
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()},
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict, data_state: dict) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)),
        )

    def restore(self, step: int, abstract_state: dict) -> tuple[dict, dict]:
        """Restore into the shapes, dtypes and shardings of `abstract_state` (a dict with `params`)."""
        saved = self.manager.item_metadata(step)["state"]
        if "opt_state" not in saved:
            workdir = self.directory.parent
            raise UserError(f"{workdir} holds imported parameters only, nothing to resume; start a new --workdir "
                            f"with --config.init_checkpoint={workdir}")
        check_shapes(saved["params"], abstract_state["params"], self.directory / str(step))
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], restored["data"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def load_params(workdir: str | pathlib.Path, step: int | None = None) -> tuple[Any, dict]:
    """A pretraining run's parameters (host numpy arrays) and its config dict, for fine-tuning or export.

    `workdir` is what `bertology.pretrain --workdir` wrote: `config.json` and `checkpoints/`.
    """
    workdir = pathlib.Path(workdir)
    config_file = workdir / "config.json"
    if not config_file.exists():
        raise UserError(f"{workdir} is not a bertology run (no config.json); pass the --workdir of a pretraining run")
    directory = workdir.absolute() / "checkpoints"
    with ocp.CheckpointManager(directory, item_handlers={"state": ocp.PyTreeCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise UserError(f"{directory} holds no checkpoint; train first or pass another workdir")
        meta = manager.item_metadata(step)["state"]["params"]
        abstract = {"params": jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)}
        restored = manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                abstract, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract),
                partial_restore=True))
        )
    params = jax.tree.map(np.asarray, restored["state"]["params"])
    return params, json.loads(config_file.read_text())


def check_shapes(saved: Any, expected: Any, where: pathlib.Path) -> None:
    """Fail with the first tensor whose saved shape differs from what the config builds."""
    saved_leaves = dict(jax.tree_util.tree_leaves_with_path(saved))
    for path, leaf in jax.tree_util.tree_leaves_with_path(expected):
        name = jax.tree_util.keystr(path)
        if path not in saved_leaves:
            raise UserError(f"checkpoint {where} has no tensor {name}; it was written by a different model config")
        got = tuple(saved_leaves[path].shape)
        if got != tuple(leaf.shape):
            raise UserError(
                f"checkpoint {where}: tensor {name} has shape {got} but the config builds {tuple(leaf.shape)}; "
                "use the config the checkpoint was trained with, or a fresh --workdir"
            )
