"""Our parameter paths <-> Hugging Face state-dict names: readable tables of modules.

A table row names a *module* on both sides and its kind. The kind (`KINDS`) says which tensors
that module holds on each side and how each tensor's layout changes (the rules below). The same
rows serve import and export, so the two directions cannot drift apart. A model type's layout
(`Part`s, in `interop/families.py`) says which tables apply under which prefixes; `tensors`
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

DISTILBERT_LAYER = (  # the trunk's embeddings are BERT's (`EMBEDDINGS`), without a segment table
    ("attention_{i}/query", "transformer.layer.{i}.attention.q_lin", "to_heads"),
    ("attention_{i}/key", "transformer.layer.{i}.attention.k_lin", "to_heads"),
    ("attention_{i}/value", "transformer.layer.{i}.attention.v_lin", "to_heads"),
    ("attention_{i}/output", "transformer.layer.{i}.attention.out_lin", "from_heads"),
    ("attention_{i}/norm", "transformer.layer.{i}.sa_layer_norm", "norm"),
    ("ffn_{i}/intermediate", "transformer.layer.{i}.ffn.lin1", "dense"),
    ("ffn_{i}/output", "transformer.layer.{i}.ffn.lin2", "dense"),
    ("ffn_{i}/norm", "transformer.layer.{i}.output_layer_norm", "norm"),
)

_ALBERT = "encoder.albert_layer_groups.0.albert_layers.0"
ALBERT_LAYER = (  # one shared layer, applied num_layers times
    ("attention_0/query", f"{_ALBERT}.attention.query", "to_heads"),
    ("attention_0/key", f"{_ALBERT}.attention.key", "to_heads"),
    ("attention_0/value", f"{_ALBERT}.attention.value", "to_heads"),
    ("attention_0/output", f"{_ALBERT}.attention.dense", "from_heads"),
    ("attention_0/norm", f"{_ALBERT}.attention.LayerNorm", "norm"),
    ("ffn_0/intermediate", f"{_ALBERT}.ffn", "dense"),
    ("ffn_0/output", f"{_ALBERT}.ffn_output", "dense"),
    ("ffn_0/norm", f"{_ALBERT}.full_layer_layer_norm", "norm"),
)
ALBERT_PROJECTION = (("embeddings_projection", "encoder.embedding_hidden_mapping_in", "dense"),)
ALBERT_POOLER = (("pooler", "pooler", "dense"),)
ELECTRA_PROJECTION = (("embeddings_projection", "embeddings_project", "dense"),)  # only when E != H

GPT2_EMBEDDINGS = (
    ("embeddings/token", "wte", "embedding"),
    ("embeddings/position", "wpe", "embedding"),
)
OPENAI_GPT_EMBEDDINGS = (
    ("embeddings/token", "tokens_embed", "embedding"),
    ("embeddings/position", "positions_embed", "embedding"),
)
GPT_LAYER = (  # GPT and GPT-2 name a block alike: ln_1 belongs to attention, ln_2 to the MLP
    ("attention_{i}/norm", "h.{i}.ln_1", "norm"),
    ("attention_{i}/query", "h.{i}.attn.c_attn", "conv1d_to_heads", (0, 3)),
    ("attention_{i}/key", "h.{i}.attn.c_attn", "conv1d_to_heads", (1, 3)),
    ("attention_{i}/value", "h.{i}.attn.c_attn", "conv1d_to_heads", (2, 3)),
    ("attention_{i}/output", "h.{i}.attn.c_proj", "conv1d_from_heads"),
    ("ffn_{i}/norm", "h.{i}.ln_2", "norm"),
    ("ffn_{i}/intermediate", "h.{i}.mlp.c_fc", "conv1d"),
    ("ffn_{i}/output", "h.{i}.mlp.c_proj", "conv1d"),
)
FINAL_NORM = (("final_norm", "ln_f", "norm"),)  # pre-LN only

# T5, T5 v1.1 and mT5: `block.{i}.layer.{j}` numbers the sublayers of a block (self-attention,
# [cross-attention,] feed-forward); only the first block holds the stack's relative bias table.
SHARED_TOKENS = (("embeddings/token", "shared", "embedding"),)
T5_STACK = (
    ("relative_bias", "block.0.layer.0.SelfAttention.relative_attention_bias", "embedding"),
    ("final_norm", "final_layer_norm", "norm"),
)
T5_SELF_ATTENTION = (
    ("attention_{i}/norm", "block.{i}.layer.0.layer_norm", "norm"),
    ("attention_{i}/query", "block.{i}.layer.0.SelfAttention.q", "to_heads"),
    ("attention_{i}/key", "block.{i}.layer.0.SelfAttention.k", "to_heads"),
    ("attention_{i}/value", "block.{i}.layer.0.SelfAttention.v", "to_heads"),
    ("attention_{i}/output", "block.{i}.layer.0.SelfAttention.o", "from_heads"),
)
T5_CROSS_ATTENTION = (
    ("cross_attention_{i}/norm", "block.{i}.layer.1.layer_norm", "norm"),
    ("cross_attention_{i}/query", "block.{i}.layer.1.EncDecAttention.q", "to_heads"),
    ("cross_attention_{i}/key", "block.{i}.layer.1.EncDecAttention.k", "to_heads"),
    ("cross_attention_{i}/value", "block.{i}.layer.1.EncDecAttention.v", "to_heads"),
    ("cross_attention_{i}/output", "block.{i}.layer.1.EncDecAttention.o", "from_heads"),
)


def t5_ffn(sublayer: int, gated: bool) -> tuple[Row, ...]:
    """T5's feed-forward block, sublayer 1 of an encoder block and 2 of a decoder block; v1.1's
    gated form names its two input projections wi_0 (the activated one) and wi_1."""
    prefix = f"block.{{i}}.layer.{sublayer}"
    inputs = ((("ffn_{i}/intermediate", f"{prefix}.DenseReluDense.wi_0", "dense"),
               ("ffn_{i}/intermediate_linear", f"{prefix}.DenseReluDense.wi_1", "dense")) if gated
              else (("ffn_{i}/intermediate", f"{prefix}.DenseReluDense.wi", "dense"),))
    return (("ffn_{i}/norm", f"{prefix}.layer_norm", "norm"), *inputs,
            ("ffn_{i}/output", f"{prefix}.DenseReluDense.wo", "dense"))


T5_HEAD = (("lm_head", "lm_head", "dense"),)  # v1.1 and mT5 only: v1.0 ties it to `shared`

BART_EMBEDDINGS = (  # each stack's own position table and norm; the token table is `shared`
    ("embeddings/position", "embed_positions", "embedding"),
    ("embeddings/norm", "layernorm_embedding", "norm"),
)
BART_LAYER = (
    ("attention_{i}/query", "layers.{i}.self_attn.q_proj", "to_heads"),
    ("attention_{i}/key", "layers.{i}.self_attn.k_proj", "to_heads"),
    ("attention_{i}/value", "layers.{i}.self_attn.v_proj", "to_heads"),
    ("attention_{i}/output", "layers.{i}.self_attn.out_proj", "from_heads"),
    ("attention_{i}/norm", "layers.{i}.self_attn_layer_norm", "norm"),
    ("ffn_{i}/intermediate", "layers.{i}.fc1", "dense"),
    ("ffn_{i}/output", "layers.{i}.fc2", "dense"),
    ("ffn_{i}/norm", "layers.{i}.final_layer_norm", "norm"),
)
BART_CROSS_ATTENTION = (
    ("cross_attention_{i}/query", "layers.{i}.encoder_attn.q_proj", "to_heads"),
    ("cross_attention_{i}/key", "layers.{i}.encoder_attn.k_proj", "to_heads"),
    ("cross_attention_{i}/value", "layers.{i}.encoder_attn.v_proj", "to_heads"),
    ("cross_attention_{i}/output", "layers.{i}.encoder_attn.out_proj", "from_heads"),
    ("cross_attention_{i}/norm", "layers.{i}.encoder_attn_layer_norm", "norm"),
)
BART_HEAD = (("final_logits_bias", "final_logits_bias", "row"),)

# Transformer-XL (HF's deprecated TransfoXL with cutoffs=[], div_val=1): the attention's query,
# key and value are one bias-free Linear `qkv_net`; `o_net` keeps our [H, heads, head_dim] flat.
TRANSFO_XL_EMBEDDINGS = (("embeddings/token", "word_emb.emb_layers.0", "embedding"),)
TRANSFO_XL_SHARED_BIASES = (  # untie_r=False: one pair for every layer
    ("biases/r_w_bias", "r_w_bias", "tensor"),
    ("biases/r_r_bias", "r_r_bias", "tensor"),
)
TRANSFO_XL_LAYER = (
    ("attention_{i}/query", "layers.{i}.dec_attn.qkv_net", "to_heads", (0, 3)),
    ("attention_{i}/key", "layers.{i}.dec_attn.qkv_net", "to_heads", (1, 3)),
    ("attention_{i}/value", "layers.{i}.dec_attn.qkv_net", "to_heads", (2, 3)),
    ("attention_{i}/position", "layers.{i}.dec_attn.r_net", "to_heads"),
    ("attention_{i}/output", "layers.{i}.dec_attn.o_net", "heads_to_linear"),
    ("attention_{i}/biases/r_w_bias", "layers.{i}.dec_attn.r_w_bias", "tensor"),
    ("attention_{i}/biases/r_r_bias", "layers.{i}.dec_attn.r_r_bias", "tensor"),
    ("attention_{i}/norm", "layers.{i}.dec_attn.layer_norm", "norm"),
    ("ffn_{i}/intermediate", "layers.{i}.pos_ff.CoreNet.0", "dense"),
    ("ffn_{i}/output", "layers.{i}.pos_ff.CoreNet.3", "dense"),
    ("ffn_{i}/norm", "layers.{i}.pos_ff.layer_norm", "norm"),
)
TRANSFO_XL_HEAD = (("output_bias", "crit.out_layers.0.bias", "tensor"),)

# XLNet: the attention's projections are bare [H, heads, head_dim] tensors, as ours.
XLNET_EMBEDDINGS = (
    ("embeddings/token", "word_embedding", "embedding"),
    ("mask_emb", "mask_emb", "tensor"),
)
XLNET_LAYER = (
    ("attention_{i}/query", "layer.{i}.rel_attn.q", "kernel_tensor"),
    ("attention_{i}/key", "layer.{i}.rel_attn.k", "kernel_tensor"),
    ("attention_{i}/value", "layer.{i}.rel_attn.v", "kernel_tensor"),
    ("attention_{i}/position", "layer.{i}.rel_attn.r", "kernel_tensor"),
    ("attention_{i}/output", "layer.{i}.rel_attn.o", "tensor"),
    ("attention_{i}/biases/r_w_bias", "layer.{i}.rel_attn.r_w_bias", "tensor"),
    ("attention_{i}/biases/r_r_bias", "layer.{i}.rel_attn.r_r_bias", "tensor"),
    ("attention_{i}/biases/r_s_bias", "layer.{i}.rel_attn.r_s_bias", "tensor"),
    ("attention_{i}/segment", "layer.{i}.rel_attn.seg_embed", "tensor"),
    ("attention_{i}/norm", "layer.{i}.rel_attn.layer_norm", "norm"),
    ("ffn_{i}/intermediate", "layer.{i}.ff.layer_1", "dense"),
    ("ffn_{i}/output", "layer.{i}.ff.layer_2", "dense"),
    ("ffn_{i}/norm", "layer.{i}.ff.layer_norm", "norm"),
)
XLNET_HEAD = (("lm_bias", "lm_loss.bias", "tensor"),)

# MobileBERT: `layer_{i}` holds a whole block (bottlenecks, attention, stacked FFNs); HF numbers
# the stacked FFNs `ffn.{j}` (num_feedforward_networks - 1 of them; rows for up to 16, the paper
# stacks 4 in all), and its last FFN is the layer's `intermediate` and `output`.
MOBILEBERT_EMBEDDINGS = (
    *EMBEDDINGS[:3],
    ("embeddings/transformation", "embeddings.embedding_transformation", "dense"),
    ("embeddings/norm", "embeddings.LayerNorm", "norm"),
)
_MB = "encoder.layer.{i}"
MOBILEBERT_LAYER = (
    ("layer_{i}/bottleneck", f"{_MB}.bottleneck.input.dense", "dense"),
    ("layer_{i}/bottleneck_norm", f"{_MB}.bottleneck.input.LayerNorm", "norm"),
    ("layer_{i}/shared_bottleneck", f"{_MB}.bottleneck.attention.dense", "dense"),
    ("layer_{i}/shared_bottleneck_norm", f"{_MB}.bottleneck.attention.LayerNorm", "norm"),
    ("layer_{i}/attention/query", f"{_MB}.attention.self.query", "to_heads"),
    ("layer_{i}/attention/key", f"{_MB}.attention.self.key", "to_heads"),
    ("layer_{i}/attention/value", f"{_MB}.attention.self.value", "to_heads"),
    ("layer_{i}/attention/output", f"{_MB}.attention.output.dense", "from_heads"),
    ("layer_{i}/attention/norm", f"{_MB}.attention.output.LayerNorm", "norm"),
    *((f"layer_{{i}}/ffn_{j}/{ours}", f"{_MB}.ffn.{j}.{hf}", kind) for j in range(15)
      for ours, hf, kind in (("intermediate", "intermediate.dense", "dense"), ("output", "output.dense", "dense"),
                             ("norm", "output.LayerNorm", "norm"))),
    ("layer_{i}/ffn_last/intermediate", f"{_MB}.intermediate.dense", "dense"),
    ("layer_{i}/ffn_last/output", f"{_MB}.output.dense", "dense"),
    ("layer_{i}/ffn_last/norm", f"{_MB}.output.LayerNorm", "norm"),
    ("layer_{i}/output_bottleneck", f"{_MB}.output.bottleneck.dense", "dense"),
    ("layer_{i}/output_bottleneck_norm", f"{_MB}.output.bottleneck.LayerNorm", "norm"),
)

# Heads, relative to the model root on both sides.
BERT_HEADS = (
    ("mlm/transform", "cls.predictions.transform.dense", "dense"),
    ("mlm/norm", "cls.predictions.transform.LayerNorm", "norm"),
    ("mlm/bias", "cls.predictions.bias", "tensor"),
    ("nsp/dense", "cls.seq_relationship", "dense"),
)
MOBILEBERT_HEADS = (
    ("mlm/transform", "cls.predictions.transform.dense", "dense"),
    ("mlm/norm", "cls.predictions.transform.LayerNorm", "norm"),
    ("mlm/extra", "cls.predictions.dense.weight", "tensor"),  # [H - E, vocab] on both sides
    ("mlm/bias", "cls.predictions.bias", "tensor"),
    ("nsp/dense", "cls.seq_relationship", "dense"),
)
ROBERTA_HEADS = (
    ("mlm/transform", "lm_head.dense", "dense"),
    ("mlm/norm", "lm_head.layer_norm", "norm"),
    ("mlm/bias", "lm_head.bias", "tensor"),
)
DISTILBERT_HEADS = (
    ("mlm/transform", "vocab_transform", "dense"),
    ("mlm/norm", "vocab_layer_norm", "norm"),
    ("mlm/bias", "vocab_projector.bias", "tensor"),
)
ALBERT_HEADS = (
    ("mlm/transform", "predictions.dense", "dense"),
    ("mlm/norm", "predictions.LayerNorm", "norm"),
    ("mlm/bias", "predictions.bias", "tensor"),
    ("sop/dense", "sop_classifier.classifier", "dense"),
)
DISCRIMINATOR_HEADS = (
    ("discriminator/dense", "discriminator_predictions.dense", "dense"),
    ("discriminator/prediction", "discriminator_predictions.dense_prediction", "dense"),
)
GENERATOR_HEADS = (
    ("generator/mlm/transform", "generator_predictions.dense", "dense"),
    ("generator/mlm/norm", "generator_predictions.LayerNorm", "norm"),
    ("generator/mlm/bias", "generator_lm_head.bias", "tensor"),
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


# Megatron-BERT (`MegatronBertForPreTraining`): pre-LN, so a layer's norms are its sublayers'
# inputs' (`attention.ln` before self-attention, the layer's own `ln` before the feed-forward
# block) and the stack ends in `encoder.ln`. Its embeddings are BERT's without a LayerNorm (the
# `EMBEDDINGS` norm row finds no tensor of ours), its pooler and heads BERT's.
MEGATRON_BERT_LAYER = (
    ("attention_{i}/norm", "encoder.layer.{i}.attention.ln", "norm"),
    ("attention_{i}/query", "encoder.layer.{i}.attention.self.query", "to_heads"),
    ("attention_{i}/key", "encoder.layer.{i}.attention.self.key", "to_heads"),
    ("attention_{i}/value", "encoder.layer.{i}.attention.self.value", "to_heads"),
    ("attention_{i}/output", "encoder.layer.{i}.attention.output.dense", "from_heads"),
    ("ffn_{i}/norm", "encoder.layer.{i}.ln", "norm"),
    ("ffn_{i}/intermediate", "encoder.layer.{i}.intermediate.dense", "dense"),
    ("ffn_{i}/output", "encoder.layer.{i}.output.dense", "dense"),
)
MEGATRON_BERT_FINAL_NORM = (("final_norm", "encoder.ln", "norm"),)
