"""Orbax checkpoints of the train state plus the data iterator's position, verified on restore.

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never leaves a half checkpoint that resume would pick up. That does not protect against
what happens to a step afterwards (a truncated or overwritten file, a power loss that leaves
zero-length files, bit rot), and a read that succeeds proves nothing about the values. So every
save also writes a manifest (the `checksums` item): a 64-bit fingerprint of each saved array and
a SHA-256 of the data position's JSON. Restore recomputes both from what it read and compares;
any failure (read error, missing or garbage file, mismatch) skips that step with a log line
saying why, moves it to `WORKDIR/corrupt_checkpoints/`, and falls back to the next older step.
A workdir whose checkpoints are all unusable is refused, never silently restarted from step 0.

Fingerprints are integer sums, so the same on any mesh or process count. Large or sharded arrays
are fingerprinted on the devices by one jitted reduction over the arrays as they are sharded (no
gather to host); small replicated ones on the host, from each process's own copy. Every process
of a multi-process run gets the same numbers, so all make the same restore decision. The same
pass checks that the state is finite: a checkpoint is never written from NaN or inf.

Before restoring, shapes are checked against the current config so a mismatch fails with one
line naming the tensor. A write that fails (disk full, quota, permissions) ends the run with one
line; the step being written never becomes a checkpoint, so the previous ones stay intact.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import pathlib
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.serialization.type_handler_registry import GLOBAL_TYPE_HANDLER_REGISTRY

from bertology.errors import UserError
from bertology.files import is_remote
from bertology.train.distributed import any_process
from bertology.train.metrics import log

# What the divergence messages (here and in the train loop) suggest.
DIVERGENCE_HINT = ("try a lower optimizer.learning_rate, more optimizer.warmup_steps, or model.dtype=float32, and "
                   "resume from the last good checkpoint with --config.allow_config_change=<the keys you changed>")

# Orbax writes an array that is replicated over R devices as R slices, one per replica, and each
# slice is a small program compiled per array shape and device: a 15-step run of the tiny ELECTRA
# on 8 CPU devices compiled 176 of them at its one checkpoint (12 of its 34 s). Splitting pays
# only for large arrays, so below 1 MiB per replica the first replica writes the whole array
# (orbax's default handler otherwise, its metadata store included). Registered without orbax's
# warning, which every process of a multi-process run would print.
GLOBAL_TYPE_HANDLER_REGISTRY.add(jax.Array, ocp.type_handlers.ArrayHandler(
    array_metadata_store=array_metadata_store.Store(), min_slice_bytes_for_replica_parallel=1 << 20),
    override=True, ignore_warnings=True)


class Checkpointer:
    """Saves and restores {step, params, opt_state, ...} with the data position and a checksum
    manifest; every process takes part (each writes its own shards), and `workdir` may be local
    or gs://."""

    def __init__(self, workdir: str | pathlib.Path, keep: int):
        workdir = epath.Path(workdir)
        self.directory = (workdir if is_remote(workdir) else workdir.absolute()) / "checkpoints"
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                           "checksums": ocp.JsonCheckpointHandler()},
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict, data_state: dict) -> None:
        """Write `state` (unless any of it is NaN or inf: then raise, writing nothing) with the
        data position and their checksums. An I/O failure raises one line naming it."""
        prints, finite = audit(state)
        if not finite:
            raise UserError(f"step {step}: the train state holds NaN or inf, so no checkpoint was written (the last "
                            f"good one is step {self.latest_step()}); {DIVERGENCE_HINT}")
        manifest = {"arrays": prints, "data": digest(data_state)}
        with write_failures(self.directory, step):
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
                checksums=ocp.args.JsonSave(manifest)))

    def restore_latest(self, abstract_state: dict) -> tuple[int, dict, dict] | None:
        """(step, state, data position) of the newest intact checkpoint, restored into the shapes,
        dtypes and shardings of `abstract_state`; None if there is no checkpoint at all. Newer
        steps that fail verification are logged and set aside; if none is intact, refuse."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        bad: list[int] = []
        for step in steps:
            restored, why = self._verified(step, abstract_state)
            if restored is not None:
                self._set_aside(bad)
                return step, restored["state"], restored["data"]
            log(f"checkpoint step {step} skipped: {why}")
            bad.append(step)
        if steps:
            raise UserError(f"no intact checkpoint in {self.directory}: steps {steps} all failed verification (reasons "
                            "above); restore them from a backup, or start over in a new --workdir")
        return None

    def _verified(self, step: int, abstract_state: dict) -> tuple[dict | None, str]:
        """(the restored items, "") if `step` reads and matches its manifest, else (None, why).
        Every process reaches the same verdict: read failures are agreed on, checksums are global."""
        restored, why, legacy = None, "", False
        try:
            saved = self.manager.item_metadata(step)["state"]
            if "opt_state" not in saved:
                workdir = self.directory.parent
                raise UserError(f"{workdir} holds imported parameters only, nothing to resume; start a new "
                                f"--workdir with --config.init_checkpoint={workdir}")
            check_shapes(saved["params"], abstract_state["params"], self.directory / str(step))
            # Checkpoints written before manifests existed have none: resumed as they are, said so.
            # They also lack the state entries added since (the skipped-step count): those start at 0.
            legacy = not (self.directory / str(step) / "checksums").exists()
            items = {} if legacy else {"checksums": ocp.args.JsonRestore()}
            added = sorted(set(abstract_state) - set(saved)) if legacy else []
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore({k: v for k, v in abstract_state.items() if k not in added}),
                data=ocp.args.JsonRestore(), **items))
            for k in added:
                restored["state"][k] = jax.device_put(np.zeros(abstract_state[k].shape, abstract_state[k].dtype),
                                                      abstract_state[k].sharding)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a damaged step raises, it is not resumable
            why = unreadable(e)
        if any_process(restored is None):
            return None, why or "unreadable on another process"
        if legacy:
            log(f"checkpoint step {step} has no checksums (written before they existed): resumed unverified")
            return restored, ""
        manifest = restored["checksums"]
        why = mismatch(restored["state"], manifest)
        if why:
            return None, why
        if digest(restored["data"]) != manifest.get("data"):
            return None, "checksum mismatch in the data-iterator state"
        return restored, ""

    def _set_aside(self, steps: list[int]) -> None:
        """Move damaged steps to WORKDIR/corrupt_checkpoints (kept for inspection), so new saves
        of those step numbers do not collide with them."""
        if not steps:
            return
        if jax.process_index() == 0:
            aside = self.directory.parent / "corrupt_checkpoints"
            aside.mkdir(parents=True, exist_ok=True)
            for step in steps:
                target = aside / f"{step}-{int(time.time())}"
                (self.directory / str(step)).rename(target)
                log(f"moved the damaged checkpoint step {step} to {target}")
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("bertology_checkpoints_set_aside")
        self.manager.reload()

    def wait(self) -> None:
        with write_failures(self.directory, None):
            self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


@contextlib.contextmanager
def write_failures(directory: epath.Path, step: int | None) -> Iterator[None]:
    """Turn an OSError anywhere in a failed save (orbax wraps them) into one line. The step being
    written stays a temporary directory that resume ignores, so the older checkpoints are intact."""
    try:
        yield
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        what = "disk full" if cause.errno in (errno.ENOSPC, errno.EDQUOT) else (cause.strerror or str(cause))
        which = "a checkpoint" if step is None else f"checkpoint step {step}"
        raise UserError(f"could not write {which} in {directory} ({what}); the checkpoints before it are intact: "
                        "free space or move the workdir to a larger disk, then rerun the same command to resume") from None


# Leaves up to this many elements that every device holds whole (the biases, norms and their
# optimizer moments of any model; every leaf of a test-sized one) are fingerprinted on the host in
# numpy: a few kilobytes each, and no compile. The jitted pass's compile time grows with its
# leaves (a tiny ELECTRA state's ~200 took 17 s, more than its 50 train steps). Larger or sharded
# leaves stay on the devices. Both paths compute the same rule, so a leaf's fingerprint does not
# depend on which one took it.
HOST_MAX_SIZE = 1 << 16

# The unsigned type each element width is read as (8-byte elements as two 4-byte halves).
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}


def audit(state: Any) -> tuple[dict[str, str], bool]:
    """({array path: 64-bit fingerprint as hex}, whether every float in `state` is finite): small
    replicated leaves on the host, the rest by one jitted pass over the arrays where they lie, with
    its result replicated to every process."""
    with_paths = jax.tree_util.tree_leaves_with_path(state)
    paths, leaves = [jax.tree_util.keystr(p) for p, _ in with_paths], [x for _, x in with_paths]
    host = {i: _local_copy(x) for i, x in enumerate(leaves) if np.size(x) <= HOST_MAX_SIZE and _replicated(x)}
    prints = {i: _host_fingerprint(x) for i, x in host.items()}
    finite = all(np.isfinite(x).all() for x in host.values() if jnp.issubdtype(x.dtype, jnp.inexact))
    device = {i: x for i, x in enumerate(leaves) if i not in host}
    if device:
        mesh = next((x.sharding.mesh for x in device.values()
                     if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)), None)
        replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        lanes, ok = jax.device_get(jax.jit(_audit, out_shardings=replicated)(list(device.values())))
        prints.update(zip(device, (tuple(int(v) for v in pair) for pair in lanes)))
        finite = finite and bool(ok)
    return {p: f"{prints[i][0]:08x}{prints[i][1]:08x}" for i, p in enumerate(paths)}, finite


def mismatch(state: dict, manifest: Any) -> str:
    """Why `state`'s arrays differ from the checksum manifest written with them ("" if they match).
    Only the manifest's entries under `state`'s top-level keys count, so a reader that restored the
    params alone checks those."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("arrays"), dict):
        return "its checksum manifest is missing or malformed"
    prints, _ = audit(state)
    tops = tuple(jax.tree_util.keystr((jax.tree_util.DictKey(k),)) for k in state)
    saved = {k: v for k, v in manifest["arrays"].items() if k.startswith(tops)}
    differ = sorted(k for k in prints.keys() | saved.keys() if prints.get(k) != saved.get(k))
    return f"checksum mismatch in {len(differ)} array(s), e.g. {differ[0]}" if differ else ""


def unreadable(error: Exception) -> str:
    """Why a step that raised `error` on reading is unusable, in one line."""
    lines = str(error).strip().splitlines()
    return f"unreadable ({type(error).__name__}: {lines[0][:200] if lines else 'no message'})"


def _replicated(x: Any) -> bool:
    sharding = getattr(x, "sharding", None)
    return sharding is None or sharding.is_fully_replicated


def _local_copy(x: Any) -> np.ndarray:
    """A replicated leaf as numpy, from this process's own copy (no transfer between processes)."""
    return np.asarray(x.addressable_shards[0].data if isinstance(x, jax.Array) else x)


def _audit(leaves: list[jax.Array]) -> tuple[list[jax.Array], jax.Array]:
    finite = jnp.array(True)
    for x in leaves:
        if jnp.issubdtype(x.dtype, jnp.inexact):
            finite &= jnp.all(jnp.isfinite(x))
    return [fingerprint(x) for x in leaves], finite


def fingerprint(x: jax.Array) -> jax.Array:
    """Two 32-bit lanes, each the wrapping sum over elements of a mix of (element bits, flat
    index): any changed bit or moved element changes them; integer sums make the result
    independent of how the array is sharded or the reduction ordered."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    bits = x if x.dtype == jnp.uint32 else jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
    if x.dtype.itemsize == 8:  # (..., 2) halves
        bits = _mix(bits[..., 0]) ^ bits[..., 1]
    index = jnp.zeros(x.shape, jnp.uint32)
    stride = 1
    for d in reversed(range(x.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, d) * jnp.uint32(stride % 2**32)
        stride *= x.shape[d]
    a, b = _lanes(bits.astype(jnp.uint32), index)
    return jnp.stack([jnp.sum(a, dtype=jnp.uint32), jnp.sum(b, dtype=jnp.uint32)])


def _host_fingerprint(x: np.ndarray) -> tuple[int, int]:
    """`fingerprint` in numpy, over the row-major flattening (the same flat index)."""
    x = np.ravel(x)
    x = x.astype(np.uint8) if x.dtype == np.bool_ else x
    bits = x.view(_UNSIGNED[x.dtype.itemsize])
    if x.dtype.itemsize == 8:  # low and high halves, as the device's bitcast orders them
        bits = _mix(bits[0::2]) ^ bits[1::2]
    a, b = _lanes(bits.astype(np.uint32), np.arange(x.size, dtype=np.uint32))
    return int(a.sum(dtype=np.uint32)), int(b.sum(dtype=np.uint32))


def _lanes(bits: Any, index: Any) -> tuple[Any, Any]:
    """The two per-element hashes that a fingerprint sums (numpy or jax uint32 arrays alike)."""
    return _mix(bits ^ _mix(index + np.uint32(0x9E3779B9))), _mix(bits + _mix(index ^ np.uint32(0x7F4A7C15)))


def _mix(h: Any) -> Any:
    """MurmurHash3's 32-bit finaliser: every input bit flips about half the output bits."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def digest(data_state: Any) -> str:
    """SHA-256 of the data position as canonical JSON (what JsonSave writes and JsonRestore reads)."""
    return hashlib.sha256(json.dumps(data_state, sort_keys=True).encode()).hexdigest()


def load_params(workdir: str | pathlib.Path, step: int | None = None) -> tuple[Any, dict]:
    """A pretraining run's parameters (host numpy arrays) and its config dict, for fine-tuning or export.

    `workdir` is what `bertology.pretrain --workdir` wrote: `config.json` and `checkpoints/`.
    """
    params, config, _ = load_run(workdir, step)
    return params, config


def load_run(workdir: str | pathlib.Path, step: int | None = None) -> tuple[Any, dict, int]:
    """`load_params`, and the step it read (`step`, or the latest): what an export's model card names.

    The params are checked against the checksum manifest saved with them, as resume checks the
    whole state (about 2 s for BERT-base's on the 2-core machine): a damaged newest step is
    skipped with a log line for the newest intact one, and a damaged `step` asked for by number is
    refused. Nothing is moved: a reader leaves the run's directory as it found it."""
    workdir = pathlib.Path(workdir)
    config_file = workdir / "config.json"
    if not config_file.exists():
        raise UserError(f"{workdir} is not a bertology run (no config.json); pass the --workdir of a pretraining run")
    directory = workdir.absolute() / "checkpoints"
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                "checksums": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(directory, item_handlers=handlers) as manager:
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            raise UserError(f"{directory} holds no checkpoint; train first or pass another workdir")
        if step is not None and step not in steps:
            raise UserError(f"{directory} has no checkpoint of step {step}; its steps are {', '.join(map(str, sorted(steps)))}")
        for candidate in steps if step is None else [step]:
            params, why = _verified_params(manager, directory / str(candidate), candidate)
            if params is not None:
                break
            if step is not None:
                raise UserError(f"checkpoint step {step} in {directory} is damaged: {why}; read another step "
                                f"(its steps are {', '.join(map(str, sorted(steps)))}) or restore it from a backup")
            log(f"checkpoint step {candidate} of {workdir} skipped: {why}")
        else:
            raise UserError(f"no intact checkpoint in {directory}: steps {steps} all failed verification (reasons "
                            "above); restore them from a backup")
    return params, read_json(config_file, "pass the --workdir of a bertology run, or restore its config.json"), candidate


def _verified_params(manager: ocp.CheckpointManager, step_dir: pathlib.Path, step: int) -> tuple[Any, str]:
    """(the step's params as host numpy arrays, "") if they read and match the manifest, else (None, why)."""
    try:
        meta = manager.item_metadata(step)["state"]["params"]
        abstract = {"params": jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)}
        # Steps written before manifests existed have none: read as they are, said so.
        legacy = not (step_dir / "checksums").exists()
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                abstract, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract),
                partial_restore=True),
            **({} if legacy else {"checksums": ocp.args.JsonRestore()})))
    except Exception as e:  # noqa: BLE001 - whatever a damaged step raises, it is not readable
        return None, unreadable(e)
    state = {"params": jax.tree.map(np.asarray, restored["state"]["params"])}
    if legacy:
        log(f"checkpoint step {step} has no checksums (written before they existed): read unverified")
        return state["params"], ""
    why = mismatch(state, restored["checksums"])
    return (None, why) if why else (state["params"], "")


def read_json(path: pathlib.Path, fix: str) -> dict[str, Any]:
    """A JSON object file (a run's or a Hugging Face model's config.json) as a dict; a missing,
    unreadable or non-object file is a UserError saying `fix`."""
    if not path.is_file():
        raise UserError(f"{path} not found; {fix}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not JSON ({str(e).splitlines()[0]}); {fix}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, not an object of settings; {fix}")
    return value


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
