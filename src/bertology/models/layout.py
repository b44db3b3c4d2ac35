"""Where each layer of a trunk lives in its parameter tree: the one answer that layer-wise
learning rates, pruning and DistilBERT's student initialisation all read.

A family's `layer_index(names)` takes a parameter's path inside the trunk (the dict keys under
`encoder`, e.g. `("attention_3", "query", "kernel")`) and says where it sits:
- `EMBEDDINGS`: below the first layer (the embedding tables, ALBERT's and ELECTRA's projection);
- an int `i >= 0`: in layer `i` only;
- `STACKED`: in a scanned stack (`nn.scan`), whose leading axis enumerates the layers 0..N-1;
- `None`: above the stack (pooler, final norm, whatever fine-tuning adds).

The shared Transformer stack's layout (`stack_layer_index`) names its unscanned layers'
sub-layers `attention_{i}`, `cross_attention_{i}` and `ffn_{i}`, and a scanned stack `layers`.
A family that names its layers otherwise (MobileBERT's `layer_{i}`) states its own rule, so
nothing that reads layers silently finds none (which once gave MobileBERT and scanned runs the
full learning rate under layer-wise decay and pruned nothing in them).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax

EMBEDDINGS = -1
STACKED = "stacked"
LayerIndex = Callable[[Sequence[str]], "int | str | None"]

_EMBEDDINGS = ("embeddings", "embeddings_projection")
_SUBLAYER = re.compile(r"(?:attention|cross_attention|ffn)_(\d+)")


def stack_layer_index(names: Sequence[str]) -> int | str | None:
    """The shared Transformer stack's rule (module docstring)."""
    if not names:
        return None
    if names[0] in _EMBEDDINGS:
        return EMBEDDINGS
    if names[0] == "layers":
        return STACKED
    match = _SUBLAYER.fullmatch(names[0])
    return int(match.group(1)) if match else None


def numbered(prefix: str) -> LayerIndex:
    """The rule of a stack whose layer `i` is one module named `{prefix}{i}` (MobileBERT's `layer_`)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)")

    def index(names: Sequence[str]) -> int | str | None:
        if names and names[0] in _EMBEDDINGS:
            return EMBEDDINGS
        match = pattern.fullmatch(names[0]) if names else None
        return int(match.group(1)) if match else None

    return index


def keys(path: tuple) -> tuple[str, ...]:
    """The dict keys of a pytree path (boxed trees add attribute entries, which carry no name)."""
    return tuple(p.key for p in path if isinstance(p, jax.tree_util.DictKey))


def in_layers(names: Sequence[str], layer_index: LayerIndex) -> int | str | None:
    """Where a parameter of a fine-tuning or pretraining tree sits: `layer_index` of its path under
    `encoder`, None for anything outside the trunk."""
    if len(names) < 2 or names[0] != "encoder":
        return None
    return layer_index(names[1:])


def layer_of(key: str, layer_index: LayerIndex) -> int | None:
    """The layer a top-level trunk module belongs to alone (None: embeddings, a scanned stack, the rest)."""
    where = layer_index((key,))
    return where if isinstance(where, int) and where >= 0 else None


def depth(trunk: dict, layer_index: LayerIndex) -> int:
    """How many distinct layers a trunk's unscanned parameters hold (ALBERT's shared layer: 1)."""
    return len({i for i in (layer_of(k, layer_index) for k in trunk) if i is not None})


def attention_blocks(trunk: dict, layer_index: LayerIndex) -> list[tuple[str, ...]]:
    """Paths (inside the trunk) of each layer's self-attention, ordered by layer: the modules with
    `query`, `key`, `value` and `output` projections whose layer is an int (one per layer)."""
    found: dict[int, tuple[str, ...]] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        if path and {"query", "key", "value", "output"} <= set(node) and not path[-1].startswith("cross"):
            where = layer_index(path)
            if isinstance(where, int) and where >= 0:
                found.setdefault(where, path)
                return
        for k, v in node.items():
            walk(v, (*path, k))

    walk(trunk, ())
    return [found[i] for i in sorted(found)]
