"""Memory per device: parameters + optimizer state per sharding strategy, and compiled train-step
memory per preset and remat policy.

    python -m benchmarks.memory [--preset base] [--batch_size 32]

Part 1 runs on 8 simulated CPU devices and only reads shapes and shardings (nothing is
allocated). Part 2 compiles the float32 train step on one device and reads XLA's
`memory_analysis()`: arguments (state + batch), outputs, and temporaries (activations kept for
the backward pass, which is what remat trades for recomputation).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.train_step import bert_config, random_batch  # noqa: E402
from bertology import models, objectives  # noqa: E402
from bertology.train import optimizer as optimizer_lib  # noqa: E402
from bertology.train import sharding  # noqa: E402
from bertology.train.step import make_train_step, state_init  # noqa: E402
from bertology.train.sharding import mesh_config  # noqa: E402

MESHES = {"dp": (8, 1), "fsdp": (8, 1), "tp": (2, 4), "fsdp_tp": (2, 4)}
MiB = 2**20


def abstract_state(config: Any, batch: dict, mesh_cfg: Any) -> tuple[Any, Any]:
    """(model, train state as ShapeDtypeStructs carrying their NamedShardings) on `mesh_cfg`."""
    model = models.build(config.model)
    tx, _ = optimizer_lib.make(config.optimizer, config.total_steps)
    mesh, rules = sharding.make_mesh(mesh_cfg), sharding.rules_for(mesh_cfg)
    init = state_init(model, tx, {k: v[:1] for k, v in batch.items()})
    with sharding.activate(mesh, rules):
        boxed = jax.eval_shape(init, jax.random.key(0))
        shardings = sharding.logical_shardings(boxed, mesh, rules)
    return model, sharding.abstract_arrays(boxed, shardings)


def state_mib_per_device(state: Any) -> float:
    """MiB of params + optimizer state on the most loaded device."""
    leaves = jax.tree.leaves({"p": state["params"], "o": state["opt_state"]})
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize for x in leaves) / MiB


def compiled_mib(config: Any, batch: dict) -> dict[str, float]:
    model, state = abstract_state(config, batch, mesh_config("dp", (1, 1)))
    tx, lr = optimizer_lib.make(config.optimizer, config.total_steps)
    step = jax.jit(make_train_step(model, objectives.get("bert"), tx, lr, 1), donate_argnums=(0,))
    stats = step.lower(state, batch, jax.random.key(0)).compile().memory_analysis()
    return {"arguments": stats.argument_size_in_bytes / MiB, "outputs": stats.output_size_in_bytes / MiB,
            "temporaries": stats.temp_size_in_bytes / MiB}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="base", help="for the per-strategy table")
    p.add_argument("--presets", default="mini,small,base", help="for the compiled-memory table")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--vocab_size", type=int, default=30522)
    args = p.parse_args(argv)

    config = bert_config(args.preset, args.vocab_size, "float32", "none")
    batch = random_batch(models.encoder_config(config.model), args.batch_size, args.seq_len, 20)
    replicated = None
    print(f"| strategy ({args.preset}, 8 devices) | mesh (data, model) | params + AdamW state per device | vs dp |")
    print("|---|---|---|---|")
    for name, shape in MESHES.items():
        mib = state_mib_per_device(abstract_state(config, batch, mesh_config(name, shape))[1])
        replicated = replicated or mib
        print(f"| {name} | {shape} | {mib:,.1f} MiB | {mib / replicated:.3f} |")

    print(f"\n| preset | remat | arguments | temporaries | (float32, batch {args.batch_size}x{args.seq_len}, 1 device) |")
    print("|---|---|---|---|---|")
    for preset in args.presets.split(","):
        for remat in ("none", "full", "dots_saveable"):
            config = bert_config(preset, args.vocab_size, "float32", remat)
            m = compiled_mib(config, random_batch(models.encoder_config(config.model), args.batch_size, args.seq_len, 20))
            print(f"| {preset} | {remat} | {m['arguments']:,.0f} MiB | {m['temporaries']:,.0f} MiB | |", flush=True)


if __name__ == "__main__":
    main()
