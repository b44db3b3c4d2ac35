"""Mesh and logical-axis rules: the only place that decides where arrays live.

Parameters carry logical axis names (see models/transformer.py: vocab, embed, hidden, heads, kv, mlp;
activations: batch, length). A rules table maps each name to a mesh axis or None, and a
parallelism strategy is nothing but such a table, named in `mesh.strategy`; the model never
changes between strategies. `mesh.rules`, when set, overrides the strategy's table.

flax assigns rules in table order and never uses one mesh axis twice in an array, so listing
`batch` first keeps activations batch-sharded under FSDP while weights take `data` on another
dimension (their `embed`, `mlp`, `vocab`, ... axis), which is ZeRO-3: every weight and its Adam
moments live 1/N per device and are all-gathered for use.

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
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from ml_collections.config_dict import placeholder

from bertology.errors import UserError

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

_DATA_PARALLEL: Rules = (("batch", "data"),)
# Megatron: attention heads and MLP hidden units split over `model`, the rest replicated.
_TENSOR_PARALLEL: Rules = (("heads", "model"), ("mlp", "model"))
# ZeRO-3: each weight split over `data` along the first of these of its axes that is free
# (kv catches the (heads, kv) biases; under fsdp_tp `heads` and `mlp` are already on `model`).
_FULLY_SHARDED: Rules = (("embed", "data"), ("mlp", "data"), ("vocab", "data"), ("hidden", "data"), ("kv", "data"))

STRATEGIES: dict[str, Rules] = {
    "dp": _DATA_PARALLEL,
    "fsdp": _DATA_PARALLEL + _FULLY_SHARDED,
    "tp": _DATA_PARALLEL + _TENSOR_PARALLEL,
    "fsdp_tp": _DATA_PARALLEL + _TENSOR_PARALLEL + _FULLY_SHARDED,
}


def mesh_config(
    strategy: str = "dp", shape: Sequence[int] = (-1, 1), axes: Sequence[str] = ("data", "model")
) -> ml_collections.ConfigDict:
    """The `mesh` block of a config: a named strategy on a mesh; `rules` (None) may override it.

    Configs call this rather than spelling the block out, so every family accepts the same
    `--config.mesh.*` overrides.
    """
    _check_strategy(strategy)
    return ml_collections.ConfigDict(
        dict(strategy=strategy, axes=tuple(axes), shape=tuple(shape), rules=placeholder(list))
    )


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise UserError(f"mesh.strategy={strategy!r} is unknown; use one of {sorted(STRATEGIES)}")


def rules_for(cfg: ml_collections.ConfigDict) -> Rules:
    """The rules table in force: `mesh.rules` if given, else the table of `mesh.strategy`.

    Config files turn tuples into lists, so a given table is turned back into tuples.
    """
    if cfg.get("rules") is not None:
        return tuple((name, tuple(axis) if isinstance(axis, list) else axis) for name, axis in cfg.rules)
    strategy = cfg.get("strategy", "dp")
    _check_strategy(strategy)
    return STRATEGIES[strategy]


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


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Make `mesh` and `rules` current for tracing (logical constraints) and placement."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings for a tree whose leaves are (abstract) LogicallyPartitioned boxes.

    A dimension that its mesh axes do not divide is kept whole (e.g. BERT's 30522-entry MLM bias
    under FSDP over 8), so a strategy works for any vocabulary; only that leaf stays replicated.
    """
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    specs = nn.logical_to_mesh(nn.get_partition_spec(boxed_tree), rules)

    def fit(spec: PartitionSpec, leaf: Any) -> NamedSharding:
        dims = [axes if leaf.shape[i] % _size(mesh, axes) == 0 else None for i, axes in enumerate(spec)]
        return NamedSharding(mesh, PartitionSpec(*dims))

    return jax.tree.map(fit, specs, _unboxed(boxed_tree), is_leaf=is_spec)


def abstract_arrays(boxed_tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying `shardings`, for an (abstract) boxed tree: what orbax restores
    into and what compilation is planned from, without tracing the initialiser again."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), _unboxed(boxed_tree), shardings)


def _unboxed(boxed_tree: Any) -> Any:
    """The values inside the logical-axis boxes (no sharding constraint applied: the leaves may be abstract)."""
    boxed = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
    return jax.tree.map(lambda x: x.value if boxed(x) else x, boxed_tree, is_leaf=boxed)


def _size(mesh: Mesh, axes: str | tuple[str, ...] | None) -> int:
    names = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[n] for n in names]))


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
    """Leading (batch) dimension over the mesh axes that the `batch` rule names."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), rules))


def batch_devices(mesh: Mesh, rules: Rules) -> int:
    """How many ways the batch is split: the size of the mesh axes the `batch` rule names."""
    return _size(mesh, nn.logical_to_mesh_axes(("batch",), rules)[0])


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
