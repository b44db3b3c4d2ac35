"""Our parameter paths <-> Hugging Face state-dict names: one readable table per family.

A table row names a *module* on both sides and its kind. The kind (`KINDS`) says which tensors
that module holds on each side and how each tensor's layout changes (`RULES`). The same rows
serve import and export, so the two directions cannot drift apart.

Layouts: a Flax Dense kernel is [in, out] and a torch Linear weight [out, in]; our attention
kernels keep the heads axis apart ([H, heads, head_dim] into heads, [heads, head_dim, H] out of
them) where HF keeps one flat [H, H] matrix.

| rule               | ours                 | Hugging Face       | ours -> HF            |
|--------------------|----------------------|--------------------|-----------------------|
| copy               | any shape            | same shape         | as is                 |
| flat               | [heads, head_dim]    | [H]                | reshape               |
| linear             | [in, *out]           | [prod(out), in]    | flatten out, transpose|
| linear_from_heads  | [heads, head_dim, o] | [o, H]             | flatten in, transpose |
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from bertology.errors import UserError
from bertology.models.transformer import TransformerConfig

COPY, FLAT, LINEAR, LINEAR_FROM_HEADS = "copy", "flat", "linear", "linear_from_heads"
RULES = {COPY: None, FLAT: None, LINEAR: 1, LINEAR_FROM_HEADS: 2}  # rule -> our kernel's input axes

# kind -> ((our leaf, HF leaf, rule), ...); a leaf of None means the row names the tensor itself.
KINDS = {
    "embedding": (("embedding", "weight", COPY),),
    "norm": (("scale", "weight", COPY), ("bias", "bias", COPY)),
    "dense": (("kernel", "weight", LINEAR), ("bias", "bias", COPY)),
    "to_heads": (("kernel", "weight", LINEAR), ("bias", "bias", FLAT)),
    "from_heads": (("kernel", "weight", LINEAR_FROM_HEADS), ("bias", "bias", COPY)),
    "tensor": ((None, None, COPY),),
}

# Rows are (our module, HF module, kind), relative to the trunk (`encoder` / `bert.` and so on).
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

# The pooler, when the checkpoint has one (RobertaForMaskedLM and BertForMaskedLM do not).
POOLERS = {"bert": "pooler.dense", "roberta": "pooler.dense", "albert": "pooler"}

# Heads, relative to the model root on both sides.
BERT_HEADS = (
    ("mlm/transform", "cls.predictions.transform.dense", "dense"),
    ("mlm/norm", "cls.predictions.transform.LayerNorm", "norm"),
    ("mlm/bias", "cls.predictions.bias", "tensor"),
    ("nsp/dense", "cls.seq_relationship", "dense"),
)
ROBERTA_HEADS = (
    ("mlm/transform", "lm_head.dense", "dense"),
    ("mlm/norm", "lm_head.layer_norm", "norm"),
    ("mlm/bias", "lm_head.bias", "tensor"),
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

# HF output layers tied to another tensor: never written, and on import they must equal it.
TIED = {
    "bert": {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
             "cls.predictions.decoder.bias": "cls.predictions.bias"},
    "roberta": {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
                "lm_head.decoder.bias": "lm_head.bias"},
    "albert": {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
               "predictions.decoder.bias": "predictions.bias"},
    "electra": {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"},
}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor's two names. `source` names the HF checkpoint holding it ("model", or ELECTRA's
    "discriminator" / "generator"). A `trunk` tensor must be in its checkpoint; a head keeps its
    fresh initialisation when absent, as HF does for heads it does not find.
    `export_only`: the generator's copy of the shared embedding tables, read from the
    discriminator on import."""

    ours: tuple[str, ...]
    hf: str
    rule: str
    source: str
    trunk: bool
    export_only: bool = False


def _tensors(rows, ours_prefix: str, hf_prefix: str, **flags) -> list[Tensor]:
    out = []
    for our_module, hf_module, kind in rows:
        for our_leaf, hf_leaf, rule in KINDS[kind]:
            ours = "/".join(p for p in (ours_prefix, our_module, our_leaf) if p)
            hf = ".".join(p for p in (hf_prefix, hf_module, hf_leaf) if p)
            out.append(Tensor(tuple(ours.split("/")), hf, rule, **flags))
    return out


def _layers(cfg: TransformerConfig, table) -> list[tuple[str, str, str]]:
    count = 1 if cfg.share_layers == "all" else cfg.num_layers
    return [(o.format(i=i), h.format(i=i), k) for i in range(count) for o, h, k in table]


def _pooler(family: str, cfg: TransformerConfig) -> list[tuple[str, str, str]]:
    return [("pooler", POOLERS[family], "dense")] if cfg.pooler else []


def tensors(family: str, cfg: TransformerConfig, generator_cfg: TransformerConfig | None = None) -> list[Tensor]:
    """Every tensor of a `family` model with encoder `cfg` (and ELECTRA's generator), both names."""
    if family == "albert":
        projection = [("embeddings_projection", "encoder.embedding_hidden_mapping_in", "dense")]
        trunk = [*EMBEDDINGS, *projection, *_layers(cfg, ALBERT_LAYER), *_pooler(family, cfg)]
        return [*_tensors(trunk, "encoder", "albert", source="model", trunk=True),
                *_tensors(ALBERT_HEADS, "", "", source="model", trunk=False)]
    if family in ("bert", "roberta"):
        heads = BERT_HEADS if family == "bert" else ROBERTA_HEADS
        trunk = [*EMBEDDINGS, *_layers(cfg, BERT_LAYER), *_pooler(family, cfg)]
        return [*_tensors(trunk, "encoder", family, source="model", trunk=True),
                *_tensors(heads, "", "", source="model", trunk=False)]
    if family == "electra":
        def projection(c: TransformerConfig) -> list:
            return [("embeddings_projection", "embeddings_project", "dense")] if c.embedding_size else []

        disc = [*EMBEDDINGS, *projection(cfg), *_layers(cfg, BERT_LAYER)]
        gen = [*projection(generator_cfg), *_layers(generator_cfg, BERT_LAYER)]
        return [*_tensors(disc, "discriminator/encoder", "electra", source="discriminator", trunk=True),
                *_tensors(DISCRIMINATOR_HEADS, "", "", source="discriminator", trunk=False),
                *_tensors(gen, "generator/encoder", "electra", source="generator", trunk=True),
                *_tensors(EMBEDDINGS, "discriminator/encoder", "electra", source="generator", trunk=True,
                          export_only=True),
                *_tensors(GENERATOR_HEADS, "", "", source="generator", trunk=False)]
    raise UserError(f"model family {family!r} has no Hugging Face name map; use bert, roberta, albert or electra")


def hf_shape(rule: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF shape of a tensor that has `shape` in our layout."""
    in_axes = RULES[rule]
    if rule == COPY:
        return tuple(shape)
    if rule == FLAT:
        return (math.prod(shape),)
    return (math.prod(shape[in_axes:]), math.prod(shape[:in_axes]))


def to_hf(rule: str, x: np.ndarray) -> np.ndarray:
    in_axes = RULES[rule]
    if in_axes is None:
        return x.reshape(hf_shape(rule, x.shape))
    return np.ascontiguousarray(x.reshape(math.prod(x.shape[:in_axes]), -1).T)


def to_ours(rule: str, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return (w if RULES[rule] is None else w.T).reshape(shape)
