"""Our parameter paths <-> Hugging Face state-dict names: readable tables of modules.

A table row names a *module* on both sides and its kind. The kind (`KINDS`) says which tensors
that module holds on each side and how each tensor's layout changes (the rules below). The same
rows serve import and export, so the two directions cannot drift apart. This module holds the
tables several families share; one family's own are in its `families/<name>/interop.py`, beside
its record, whose layout (`Part`s) says which tables apply under which prefixes; `tensors`
expands it against the parameters a model config builds, so a module the config does not build
(a pooler, a final norm, a segment table, an embedding projection) has no row, and `{i}` runs
over the layers that exist.

Layouts: a Flax Dense kernel is [in, out]; a torch Linear weight is [out, in], while the Conv1D
of GPT and GPT-2 keeps [in, out]. Our attention kernels keep the heads axis apart
([H, heads, head_dim] into heads, [heads, head_dim, H] out of them) where HF keeps one flat
matrix.

| rule               | ours                 | Hugging Face       | ours -> HF            |
|--------------------|----------------------|--------------------|-----------------------|
| copy               | any shape            | same shape         | as is                 |
| flat               | [heads, head_dim]    | [H]                | reshape               |
| row                | [n]                  | [1, n]             | reshape               |
| linear             | [in, *out]           | [prod(out), in]    | flatten out, transpose|
| linear_from_heads  | [heads, head_dim, o] | [o, H]             | flatten in, transpose |
| conv1d             | [in, *out]           | [in, prod(out)]    | flatten out           |
| conv1d_from_heads  | [heads, head_dim, o] | [H, o]             | flatten in            |

Fused tensors: a row may carry `(j, n)`, meaning the HF tensor concatenates n of our tensors
along its output axis (the last, or the first of a transposed torch Linear weight) and this row
is the j-th (GPT-2's `c_attn` holds query, key and value: [H, 3H] and [3H]; Transformer-XL's
`qkv_net` Linear: [3H, H]). Import splits the HF tensor; export concatenates the n parts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable

import numpy as np

from bertology.errors import UserError

COPY, FLAT, ROW, LINEAR, LINEAR_FROM_HEADS = "copy", "flat", "row", "linear", "linear_from_heads"
CONV1D, CONV1D_FROM_HEADS = "conv1d", "conv1d_from_heads"
# Matrix rules: rule -> (how many leading axes of our kernel are its input, whether HF transposes)
MATRIX = {LINEAR: (1, True), LINEAR_FROM_HEADS: (2, True), CONV1D: (1, False), CONV1D_FROM_HEADS: (2, False)}

# kind -> ((our leaf, HF leaf, rule), ...); a leaf of None means the row names the tensor itself.
KINDS = {
    "embedding": (("embedding", "weight", COPY),),
    "norm": (("scale", "weight", COPY), ("bias", "bias", COPY)),
    "dense": (("kernel", "weight", LINEAR), ("bias", "bias", COPY)),
    "to_heads": (("kernel", "weight", LINEAR), ("bias", "bias", FLAT)),
    "from_heads": (("kernel", "weight", LINEAR_FROM_HEADS), ("bias", "bias", COPY)),
    "conv1d": (("kernel", "weight", CONV1D), ("bias", "bias", COPY)),
    "conv1d_to_heads": (("kernel", "weight", CONV1D), ("bias", "bias", FLAT)),
    "conv1d_from_heads": (("kernel", "weight", CONV1D_FROM_HEADS), ("bias", "bias", COPY)),
    "tensor": ((None, None, COPY),),
    "kernel_tensor": (("kernel", None, COPY),),  # our Dense-style module, a bare HF tensor (XLNet's q)
    "heads_to_linear": ((None, "weight", CONV1D),),  # our [H, heads, head_dim] tensor, a Linear [H, H] weight
    "row": ((None, None, ROW),),
}

# Rows are (our module, HF module, kind[, (j, n) for the j-th of n fused parts]), relative to
# their part's prefixes (the trunk's: `encoder` / `bert.` and so on).
Row = tuple
EMBEDDINGS = (
    ("embeddings/token", "embeddings.word_embeddings", "embedding"),
    ("embeddings/position", "embeddings.position_embeddings", "embedding"),
    ("embeddings/segment", "embeddings.token_type_embeddings", "embedding"),
    ("embeddings/norm", "embeddings.LayerNorm", "norm"),
)

BERT_LAYER = (  # BERT, RoBERTa and ELECTRA: `{i}` is the layer index
    ("attention_{i}/query", "encoder.layer.{i}.attention.self.query", "to_heads"),
    ("attention_{i}/key", "encoder.layer.{i}.attention.self.key", "to_heads"),
    ("attention_{i}/value", "encoder.layer.{i}.attention.self.value", "to_heads"),
    ("attention_{i}/output", "encoder.layer.{i}.attention.output.dense", "from_heads"),
    ("attention_{i}/norm", "encoder.layer.{i}.attention.output.LayerNorm", "norm"),
    ("ffn_{i}/intermediate", "encoder.layer.{i}.intermediate.dense", "dense"),
    ("ffn_{i}/output", "encoder.layer.{i}.output.dense", "dense"),
    ("ffn_{i}/norm", "encoder.layer.{i}.output.LayerNorm", "norm"),
)
BERT_POOLER = (("pooler", "pooler.dense", "dense"),)  # absent from BertForMaskedLM, RobertaForMaskedLM

SHARED_TOKENS = (("embeddings/token", "shared", "embedding"),)  # T5's and BART's, both stacks' token table

# Heads, relative to the model root on both sides.
BERT_HEADS = (
    ("mlm/transform", "cls.predictions.transform.dense", "dense"),
    ("mlm/norm", "cls.predictions.transform.LayerNorm", "norm"),
    ("mlm/bias", "cls.predictions.bias", "tensor"),
    ("nsp/dense", "cls.seq_relationship", "dense"),
)


@dataclasses.dataclass(frozen=True)
class Part:
    """Tables under one pair of prefixes, in one HF checkpoint (`source`: "model", or ELECTRA's
    "discriminator" / "generator"). `trunk`: its tensors must be in the checkpoint; otherwise
    (heads) a missing one keeps its fresh initialisation, as HF does for heads it does not find.
    `export_only`: written on export but read from another part on import (ELECTRA's generator
    checkpoint repeats the discriminator's embedding tables, which both networks share).
    `requires` / `excludes`: a module path under `ours` that our model must have / lack for the
    part to apply, where one of our modules has different HF names in two variants (T5's
    feed-forward input is `wi`, or `wi_0` and `wi_1` when gated)."""

    source: str
    ours: str
    hf: str
    tables: tuple[tuple[Row, ...], ...]
    trunk: bool
    export_only: bool = False
    requires: str | None = None
    excludes: str | None = None

    def applies(self, modules: Collection[tuple[str, ...]]) -> bool:
        """Whether this part's tables apply to a model with these module paths."""
        return ((self.requires is None or _path(self.ours, self.requires, None) in modules)
                and (self.excludes is None or _path(self.ours, self.excludes, None) not in modules))


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor's two names, its layout rule, and (for a fused HF tensor) which part it is."""

    ours: tuple[str, ...]
    hf: str
    rule: str
    source: str
    trunk: bool
    export_only: bool = False
    fused: tuple[int, int] = (0, 1)

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the whole HF tensor when ours has `shape`."""
        matrix, transposed = _layout(self.rule, shape)
        if transposed:
            return (matrix[1] * self.fused[1], matrix[0])
        return (*matrix[:-1], matrix[-1] * self.fused[1])

    @property
    def fused_axis(self) -> int:
        """The HF axis along which fused parts are concatenated: the output axis."""
        return 0 if self.rule in MATRIX and MATRIX[self.rule][1] else -1

    def to_ours(self, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Our tensor of `shape` from the whole HF tensor `w`."""
        index, count = self.fused
        w = np.split(w, count, axis=self.fused_axis)[index]
        _, transposed = _layout(self.rule, shape)
        return np.ascontiguousarray((w.T if transposed else w).reshape(shape))

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        """This row's part of the HF tensor (the whole tensor unless fused)."""
        matrix, transposed = _layout(self.rule, x.shape)
        y = x.reshape(matrix)
        return np.ascontiguousarray(y.T if transposed else y)


def _layout(rule: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
    """(our tensor reshaped as HF keeps it, before any transpose; whether HF transposes it)."""
    if rule == COPY:
        return tuple(shape), False
    if rule == FLAT:
        return (math.prod(shape),), False
    if rule == ROW:
        return (1, math.prod(shape)), False
    in_axes, transposed = MATRIX[rule]
    return (math.prod(shape[:in_axes]), math.prod(shape[in_axes:])), transposed


def _expand(table: tuple[Row, ...], ours_prefix: str, modules: Collection[tuple[str, ...]]) -> list[Row]:
    """The table's rows for every layer `{i}` our model has (the table itself if it has no `{i}`)."""
    if not any("{i}" in row[0] for row in table):
        return list(table)
    rows, i = [], 0
    while True:
        layer = [(row[0].format(i=i), row[1].format(i=i), *row[2:]) for row in table]
        if not any(_path(ours_prefix, row[0], None) in modules for row in layer):
            return rows
        rows.extend(layer)
        i += 1


def _path(prefix: str, module: str, leaf: str | None) -> tuple[str, ...]:
    return tuple("/".join(p for p in (prefix, module, leaf) if p).split("/"))


def tensors(layout: Iterable[Part], shapes: Collection[tuple[str, ...]]) -> list[Tensor]:
    """Every tensor of `layout` that a model with parameters `shapes` (flattened paths) has."""
    modules = {path[:k] for path in shapes for k in range(1, len(path))}
    out = []
    for part in (p for p in layout if p.applies(modules)):
        for table in part.tables:
            for our_module, hf_module, kind, *fused in _expand(table, part.ours, modules):
                for our_leaf, hf_leaf, rule in KINDS[kind]:
                    ours = _path(part.ours, our_module, our_leaf)
                    if ours not in shapes:
                        continue
                    hf = ".".join(p for p in (part.hf, hf_module, hf_leaf) if p)
                    out.append(Tensor(ours, hf, rule, part.source, part.trunk, part.export_only, *fused))
    return out


def export_state(rows: Iterable[Tensor], params: dict[tuple[str, ...], np.ndarray],
                 shapes: dict[tuple[str, ...], tuple[int, ...]], where: str) -> dict[str, dict[str, np.ndarray]]:
    """HF state dicts by source from our flattened `params`, each checked against the config's
    `shapes`; fused parts are concatenated."""
    rows = list(rows)
    parts: dict[str, dict[str, list]] = {}
    for row in rows:
        if row.ours not in params:
            raise UserError(f"{where}: the checkpoint has no tensor {'/'.join(row.ours)}; "
                            "it does not fit its config.json")
        x = np.asarray(params[row.ours], np.float32)
        if x.shape != shapes[row.ours]:
            raise UserError(f"{where}: tensor {'/'.join(row.ours)} has shape {x.shape} but its config.json builds "
                            f"{shapes[row.ours]}")
        slots = parts.setdefault(row.source, {}).setdefault(row.hf, [None] * row.fused[1])
        slots[row.fused[0]] = row.to_hf(x)
    axes = {row.hf: row.fused_axis for row in rows}
    return {source: {name: np.concatenate(p, axis=axes[name]) if len(p) > 1 else p[0] for name, p in state.items()}
            for source, state in parts.items()}
