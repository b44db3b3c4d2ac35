"""Mesh and logical-axis rules: the only place that decides where arrays live.

Parameters carry logical axis names (see models/encoder.py); the config's `mesh.rules` maps each
name to a mesh axis or None. A different parallelism strategy is a different rules table.

Two pitfalls on these versions, handled here: `jax.make_mesh` defaults to Explicit axis types
(we ask for Auto so linen's logical constraints apply), and `with mesh:` silently turns linen's
logical constraints into no-ops (callers use `activate`, which calls `jax.set_mesh`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from bertology.errors import UserError

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def make_mesh(mesh_config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with axes `mesh.axes` of sizes `mesh.shape`; one -1 takes all remaining devices."""
    devices = list(devices if devices is not None else jax.devices())
    axes = tuple(mesh_config.axes)
    shape = list(mesh_config.shape)
    if len(axes) != len(shape):
        raise UserError(f"mesh.axes {axes} and mesh.shape {tuple(shape)} differ in length; give one size per axis")
    if shape.count(-1) > 1:
        raise UserError(f"mesh.shape {tuple(shape)} has more than one -1; at most one axis can take the rest")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        shape[shape.index(-1)] = len(devices) // known
    need = int(np.prod(shape))
    if need == 0 or need > len(devices) or (-1 in mesh_config.shape and need != len(devices)):
        raise UserError(
            f"mesh.shape {tuple(mesh_config.shape)} needs {need} devices but {len(devices)} are present; "
            "set mesh.shape so the sizes multiply to at most the device count"
        )
    # An explicit shape smaller than the device count uses the first devices (e.g. (1, 1) for one).
    return jax.make_mesh(tuple(shape), axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices[:need])


def rules_from_config(rules: Sequence[Sequence[Any]]) -> Rules:
    return tuple((name, tuple(axis) if isinstance(axis, list) else axis) for name, axis in rules)


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Make `mesh` and `rules` current for tracing (logical constraints) and placement."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings for a tree whose leaves are (abstract) LogicallyPartitioned boxes."""
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_tree), mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
    """Leading (batch) dimension over the mesh axes that the `batch` rule names."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), rules))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh, rules: Rules) -> dict[str, jax.Array]:
    """Assemble this process's rows into global arrays sharded over the batch axes."""
    sharding = batch_sharding(mesh, rules)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def bytes_per_device(tree: Any) -> dict[str, int]:
    """Bytes each device holds of a tree of jax.Arrays (for reports and tests)."""
    out: dict[str, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            key = str(shard.device)
            out[key] = out.get(key, 0) + shard.data.nbytes
    return out
