"""Experiment trackers beside metrics.jsonl and TensorBoard: Weights & Biases and trackio.

Both are off unless a project is named (`--config.logging.wandb.project=NAME`,
`--config.logging.trackio.project=NAME`), and neither package is needed otherwise (the extras
`bertology[wandb]`, `bertology[trackio]`). metrics.jsonl stays the record: resume trims it,
`bertology analyze` and the exported model card read it. A tracker receives the resolved config
once and every row as it is written to metrics.jsonl, from process 0 only, like every file of a run.

A run keeps its tracker runs across resumes: the first start writes WORKDIR/trackers.json (the W&B
run id, the trackio run name) and every resume reopens those runs. A resumed run redoes the steps
after its checkpoint, and the trackers receive those rows again. W&B's own step counter must only
grow (it drops rows with a smaller step), so rows are plotted against a logged `step` metric
instead. The redone steps then appear twice, as in TensorBoard; metrics.jsonl keeps the values
the run went on with.
"""

from __future__ import annotations

import importlib
import json
import secrets
from typing import Any, Mapping, Protocol

import ml_collections
from etils import epath
from ml_collections.config_dict import placeholder

from bertology.errors import UserError
from bertology.files import is_remote, replace_text


def logging_config() -> ml_collections.ConfigDict:
    """The `logging` block of every pretraining and fine-tuning config."""
    return ml_collections.ConfigDict(dict(
        wandb=ml_collections.ConfigDict(dict(
            project=placeholder(str),  # a W&B project: log the run there (None: no W&B)
            entity=placeholder(str),  # the W&B team or user; None: the account's default
            mode="online",  # online | offline (kept under WORKDIR/wandb; `wandb sync` uploads it later)
            name=placeholder(str),  # the run's display name; None: the workdir's name
        )),
        trackio=ml_collections.ConfigDict(dict(
            project=placeholder(str),  # a trackio project (None: no trackio); local SQLite under TRACKIO_DIR
            name=placeholder(str),  # the run's name; None: the workdir's name and a random suffix
        )),
    ))


class Tracker(Protocol):
    def log(self, step: int, row: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class WandbTracker:
    def __init__(self, settings: ml_collections.ConfigDict, run_id: str, name: str, workdir: epath.Path,
                 config: dict[str, Any]):
        wandb = _require("wandb")
        # W&B keeps its files in a local directory: the workdir's, or on gs:// its default (./wandb)
        self._run = wandb.init(project=settings.project, entity=settings.entity, id=run_id, name=name,
                               resume="allow", mode=settings.mode, config=config,
                               dir=None if is_remote(workdir) else str(workdir))
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def log(self, step: int, row: Mapping[str, float]) -> None:
        self._run.log({"step": step, **row})

    def close(self) -> None:
        self._run.finish()


class TrackioTracker:
    def __init__(self, settings: ml_collections.ConfigDict, name: str, config: dict[str, Any]):
        self._trackio = _require("trackio")
        self._trackio.init(project=settings.project, name=name, config=config, resume="allow")

    def log(self, step: int, row: Mapping[str, float]) -> None:
        self._trackio.log(dict(row), step=step)

    def close(self) -> None:
        self._trackio.finish()


def open_trackers(config: ml_collections.ConfigDict, workdir: epath.Path) -> list[Tracker]:
    """The trackers `config.logging` names, resuming the runs WORKDIR/trackers.json records (and
    recording new ones there). Call on process 0 only."""
    settings = config.get("logging")
    if settings is None or not (settings.wandb.project or settings.trackio.project):
        return []
    ids_file = workdir / "trackers.json"
    ids = json.loads(ids_file.read_text()) if ids_file.exists() else {}
    resolved = json.loads(config.to_json_best_effort())
    trackers: list[Tracker] = []
    if settings.wandb.project:
        ids.setdefault("wandb", secrets.token_hex(4))
        trackers.append(WandbTracker(settings.wandb, ids["wandb"], settings.wandb.name or workdir.name, workdir,
                                     resolved))
    if settings.trackio.project:
        ids.setdefault("trackio", settings.trackio.name or f"{workdir.name}-{secrets.token_hex(2)}")
        trackers.append(TrackioTracker(settings.trackio, ids["trackio"], resolved))
    replace_text(ids_file, json.dumps(ids, indent=2))
    return trackers


def _require(package: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError:
        raise UserError(f"logging.{package}.project is set but {package} is not installed; "
                        f'pip install "bertology[{package}]", or unset logging.{package}.project') from None
