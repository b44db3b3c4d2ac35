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


def _rule(layer: str, stacked: str | None = None) -> LayerIndex:
    """The layer_index of a trunk whose top-level modules of layer i match the regex `layer` (one
    group: i), whose scanned stack (if any) is the module `stacked`, and whose embeddings are `_EMBEDDINGS`."""
    pattern = re.compile(layer)

    def index(names: Sequence[str]) -> int | str | None:
        if not names:
            return None
        if names[0] in _EMBEDDINGS:
            return EMBEDDINGS
        if names[0] == stacked:
            return STACKED
        match = pattern.fullmatch(names[0])
        return int(match.group(1)) if match else None

    return index


# The shared Transformer stack's rule (module docstring).
stack_layer_index = _rule(r"(?:attention|cross_attention|ffn)_(\d+)", stacked="layers")


def numbered(prefix: str) -> LayerIndex:
    """The rule of a stack whose layer `i` is one module named `{prefix}{i}` (MobileBERT's `layer_`)."""
    return _rule(re.escape(prefix) + r"(\d+)")


def keys(path: tuple) -> tuple[str, ...]:
    """The dict keys of a pytree path (boxed trees add attribute entries, which carry no name)."""
    return tuple(p.key for p in path if isinstance(p, jax.tree_util.DictKey))


def in_layers(names: Sequence[str], layer_index: LayerIndex) -> int | str | None:
    """Where a parameter of a fine-tuning or pretraining tree sits: `layer_index` of its path under
    `encoder`, None for anything outside the trunk."""
    if len(names) < 2 or names[0] != "encoder":
        return None
    return layer_index(names[1:])


def layer_of(names: Sequence[str], layer_index: LayerIndex) -> int | None:
    """The one layer a trunk path belongs to (None: embeddings, a scanned stack, above the stack)."""
    where = layer_index(names)
    return where if isinstance(where, int) and where >= 0 else None


def depth(trunk: dict, layer_index: LayerIndex) -> int:
    """How many distinct layers a trunk's unscanned parameters hold (ALBERT's shared layer: 1)."""
    return len({i for i in (layer_of((k,), layer_index) for k in trunk) if i is not None})


def attention_blocks(trunk: dict, layer_index: LayerIndex) -> list[tuple[str, ...]]:
    """Paths (inside the trunk) of each layer's self-attention, ordered by layer: the modules with
    `query`, `key`, `value` and `output` projections whose layer is an int (one per layer)."""
    found: dict[int, tuple[str, ...]] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        if path and {"query", "key", "value", "output"} <= set(node) and not path[-1].startswith("cross"):
            layer = layer_of(path, layer_index)
            if layer is not None:
                found.setdefault(layer, path)
                return
        for k, v in node.items():
            walk(v, (*path, k))

    walk(trunk, ())
    return [found[i] for i in sorted(found)]
