"""ERNIE (Tsinghua; Zhang et al. 2019, "ERNIE: Enhanced Language Representation with Informative
Entities"): a text encoder, then a knowledgeable encoder that fuses the token stream with the
entities aligned to it.

- T-Encoder: the core's `num_layers` (the paper's N) post-LN Transformer layers over the tokens.
- K-Encoder: `knowledge_layers` (M) aggregators (§4.2). Each runs multi-head self-attention on the
  tokens and, in the entity width `entity_size` with `entity_heads` heads, on the entity stream
  (each with its residual and LayerNorm), then the information fusion layer
      h = GELU(W̃_t w̃ + W̃_e ẽ + b̃)   at a token aligned to an entity,
      h = GELU(W̃_t w̃ + b̃)           elsewhere (its entity slot is zero),
  and from h a new token and entity state. The paper writes those as w = σ(W_t h + b_t) and
  e = σ(W_e h + b_e); we follow thunlp/ERNIE's `BertIntermediate` / `BertOutput`, which the
  released model computes: h is `intermediate_size` wide and each output is
  LayerNorm(dropout(W h + b) + the attention output), BERT's feed-forward block with two inputs
  and two outputs. The entity attention's output is zeroed where no entity is aligned before the
  fusion (the reference's `attention_output_ent * ent_mask`), and the first token always counts as
  aligned (a zero entity), so the entity attention has a key in every row, as the reference's
  `mask[:, 0] = 1`.

The entity vectors are frozen TransE embeddings that the data transform puts in the batch
(`entity_vectors` [batch, length, entity_size] and `entity_mask`), as the reference's collate
function looks them up outside the model; they are never parameters. Fine-tuning and
`bertology.features` feed the trunk the same two arrays (`task_inputs`): the task text's mentions
of the graph the run was pretrained with (`model.kg`, which the presets tie to `data.kg`), aligned
as pretraining aligns them, with no corruption.

Heads: BERT's MLM (tied) and NSP, and the denoising entity auto-encoder's (`EntityHead`): each
token's final state through Dense(H → entity_size) + GELU + LayerNorm, scored against its row's
candidate entity vectors by a dot product (the reference's `BertEntPredictionHead`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from collections.abc import Hashable
from typing import Any, Sequence, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError
from bertology.families.ernie_kg import knowledge
from bertology.files import stamps
from bertology.models import Family, ModelConfig, encoder_config, flops, layout, transformer_config
from bertology.models.heads import ClassifierHead, MaskedLMHead
from bertology.models.transformer import (
    Attention,
    Dropout,
    Mask,
    Stack,
    TransformerConfig,
    dense,
    extend,
    gather_positions,
    layer_norm,
)

Array = jax.Array
EXTRA_KEYS = ("knowledge_layers", "entity_size", "entity_heads", "kg")


@dataclasses.dataclass(frozen=True)
class Config(TransformerConfig):
    """The core's config (the T-Encoder is its `num_layers`) plus the K-Encoder's settings and
    the graph whose entity vectors it was trained to read (`kg`: `data.kg`'s value, kept in the
    model block because a run's fine-tuning and features see only that block)."""

    knowledge_layers: int = 6  # M, the aggregators (paper: 6)
    entity_size: int = 100  # the TransE vectors' width (paper: 100)
    entity_heads: int = 4  # the entity self-attention's heads (thunlp/ERNIE: 4)
    kg: str = "embedded"  # a knowledge.py graph directory, or "embedded"

    def __post_init__(self):
        super().__post_init__()
        if self.knowledge_layers < 1:
            raise UserError(f"model.knowledge_layers={self.knowledge_layers}: ERNIE's K-Encoder needs at least one "
                            "aggregator (paper: 6)")
        if self.entity_size < 1 or self.entity_heads < 1 or self.entity_size % self.entity_heads:
            raise UserError(f"model.entity_size={self.entity_size} is not divisible into model.entity_heads="
                            f"{self.entity_heads} heads; use e.g. 100 and 4 (thunlp/ERNIE)")
        if self.norm != "post" or self.scan_layers:
            raise UserError(f"model.norm={self.norm!r}, scan_layers={self.scan_layers}: ERNIE's aggregators are "
                            "post-LN BERT layers, run one by one; set norm='post' and scan_layers=False")

    def entity_config(self) -> TransformerConfig:
        """The entity stream's layers: `entity_size` wide, `entity_heads` heads, the fusion's width."""
        return TransformerConfig(vocab_size=self.vocab_size, hidden_size=self.entity_size, num_layers=1,
                                 num_heads=self.entity_heads, intermediate_size=self.intermediate_size,
                                 dropout_rate=self.dropout_rate, attention_dropout_rate=self.attention_dropout_rate,
                                 layer_norm_eps=self.layer_norm_eps, initializer_range=self.initializer_range,
                                 dtype=self.dtype, activation=self.activation, attention_backend=self.attention_backend)


def config(model_config: ModelConfig) -> Config:
    """The trunk's config: the block's core keys plus `EXTRA_KEYS` (None: the paper's value)."""
    block = dict(model_config)
    extra = {k: v for k in EXTRA_KEYS if (v := block.pop(k, None)) is not None}
    return extend(transformer_config(block), Config, **extra)


def entity_stream(batch: dict[str, Array], shape: Sequence[int], cfg: Config) -> tuple[Array, Array]:
    """The entity inputs [batch, length, entity_size] and where an entity is aligned [batch, length, 1]
    (the first token always): the batch's `entity_vectors` and `entity_mask`, or none at all."""
    rows, length = shape[0], shape[1]
    vectors = batch.get("entity_vectors")
    if vectors is None:
        vectors = jnp.zeros((rows, length, cfg.entity_size), cfg.compute_dtype)
    elif vectors.shape[-1] != cfg.entity_size:
        raise UserError(f"the entity vectors are {vectors.shape[-1]} wide but model.entity_size={cfg.entity_size}; "
                        "set it to the width of data.kg's entity2vec.vec")
    present = jnp.asarray(batch.get("entity_mask", jnp.zeros((rows, length), jnp.int32))) > 0
    present = present.at[:, 0].set(True)
    return vectors.astype(cfg.compute_dtype), present[..., None]


class Aggregator(nn.Module):
    """One K-Encoder layer (the module docstring): token and entity self-attention, then the fusion."""

    cfg: Config

    @nn.compact
    def __call__(self, w: Array, e: Array, mask: Mask, present: Array, deterministic: bool) -> tuple[Array, Array]:
        cfg, ecfg = self.cfg, self.cfg.entity_config()
        w = Attention(cfg, name="attention")(w, mask, None, deterministic)
        e = Attention(ecfg, name="entity_attention")(e, Mask(keys=present[..., 0]), None, deterministic)
        e = e * present.astype(e.dtype)
        h = cfg.act(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "fusion")(w)
                    + dense(cfg, cfg.intermediate_size, (None, "mlp"), "fusion_entity")(e))
        out_w = Dropout(cfg.dropout_rate)(dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h), deterministic)
        out_e = Dropout(cfg.dropout_rate)(dense(cfg, cfg.entity_size, ("mlp", None), "entity_output")(h),
                                          deterministic)
        return layer_norm(cfg, "norm")(w + out_w), layer_norm(ecfg, "entity_norm")(e + out_e)


class KnowledgeEncoder(Stack):
    """The T-Encoder (the core stack's embeddings and `num_layers` layers), the K-Encoder's
    aggregators `knowledge_{N + j}` (named by their depth, so that `layer_index` reads them as
    layers N ... N + M − 1) and BERT's pooler. Returns `sequence` (the token stream after the last
    aggregator), `pooled` and every layer's token states."""

    cfg: Config

    def setup(self):
        super().setup()
        n = self.cfg.num_layers
        self.knowledge = [Aggregator(self.cfg, name=f"knowledge_{n + j}") for j in range(self.cfg.knowledge_layers)]
        if self.cfg.pooler:
            self.pooler = dense(self.cfg, self.cfg.hidden_size, ("embed", "hidden"), "pooler")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        layers = self.run(batch, deterministic)
        w = layers[-1]
        e, present = entity_stream(batch, w.shape, self.cfg)
        mask = Mask.from_batch(batch)
        for aggregator in self.knowledge:
            w, e = aggregator(w, e, mask, present, deterministic)
            layers.append(w)
        pooled = jnp.tanh(self.pooler(w[:, 0])) if self.cfg.pooler else w[:, 0]
        return {"sequence": w, "pooled": pooled, "layers": layers}


class EntityHead(nn.Module):
    """The dEA's scores: each token's state through Dense(H → entity_size) + GELU + LayerNorm, dotted
    with its row's candidate entity vectors [batch, candidates, entity_size]; masked candidates -inf."""

    cfg: Config

    @nn.compact
    def __call__(self, sequence: Array, candidates: Array, candidate_mask: Array) -> Array:
        cfg = self.cfg
        x = cfg.act(dense(cfg, cfg.entity_size, ("embed", None), "transform")(sequence))
        x = layer_norm(cfg.entity_config(), "norm")(x)
        logits = jnp.einsum("bld,bkd->blk", x.astype(jnp.float32), candidates.astype(jnp.float32))
        return jnp.where(candidate_mask[:, None, :] > 0, logits, -jnp.inf)


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, predictions, vocab], `nsp_logits` [batch, 2] and `dea_logits`
    [batch, length, candidates]."""

    cfg: Config

    def setup(self):
        self.encoder = KnowledgeEncoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.nsp = ClassifierHead(self.cfg, num_classes=2, name="nsp")
        self.dea = EntityHead(self.cfg, name="dea")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        out = self.encoder(batch, deterministic=deterministic)
        sequence = out["sequence"]
        return {
            "mlm_logits": self.mlm(gather_positions(sequence, batch["masked_positions"]), self.encoder.attend),
            "nsp_logits": self.nsp(out["pooled"]),
            "dea_logits": self.dea(sequence, batch["entity_candidates"], batch["entity_candidate_mask"]),
        }


def trunk(params: dict) -> dict:
    return params["encoder"]


def task_trunk(cfg: Config, name: str) -> KnowledgeEncoder:
    """Fine-tuning's trunk: the knowledgeable encoder (parameters `trunk(params)`), reading the
    entities `task_inputs` aligns."""
    return KnowledgeEncoder(cfg, name=name)


@functools.lru_cache(maxsize=1)
def _aligner(directory: pathlib.Path, stamp: str, tokenizer: Tokenizer) -> tuple[knowledge.Graph, knowledge.MentionMatcher]:
    """The graph and its mention matcher, read once for every split a task aligns (`stamp`: the
    files' `bertology.files.stamps`, so a graph rewritten in place is read again). One is kept: a real
    graph's vectors take gigabytes, and a fine-tuning run reads one graph."""
    del stamp
    graph = knowledge.read_graph(directory)
    return graph, knowledge.MentionMatcher(graph.mentions, tokenizer)


def task_inputs(cfg: Config, tokenizer: Tokenizer, arrays: dict[str, np.ndarray],
                kind: str | None = None) -> dict[str, np.ndarray]:
    """Fine-tuning or feature rows ([..., length] ids: a choice task's [rows, choices, length] too)
    with the entity inputs the K-Encoder was pretrained on: `entity_vectors` [..., length,
    entity_size] and `entity_mask` [..., length].

    The rows' mentions of the run's graph (`cfg.kg`) are aligned to their first tokens by the
    matcher pretraining used, so a task row reads an entity wherever a pretraining row would have;
    every aligned entity is kept (pretraining's `data.max_entities` bounds the dEA's candidates,
    which no task head scores) and none is corrupted. The vectors travel in the rows, as in
    pretraining's batches, never as parameters."""
    del kind  # every head reads the same entities
    directory = knowledge.graph_directory(cfg.kg)
    if not directory.is_dir():
        raise UserError(f"model.kg={cfg.kg!r}: no such directory here; fine-tuning aligns task text with the graph "
                        "the run was pretrained on, so give that graph at this path (a relative path is read from "
                        "the current directory)")
    stamp = stamps(f for f in map(directory.joinpath, knowledge.FILES) if f.is_file())
    graph, matcher = _aligner(directory, stamp, cast(Hashable, tokenizer))  # the tokenizer objects hash by identity
    ids = arrays["input_ids"]
    aligned = np.asarray([matcher.align(row) for row in ids.reshape(-1, ids.shape[-1])], np.int32).reshape(ids.shape)
    return {**arrays, "entity_vectors": knowledge.lookup(aligned, graph.vectors),
            "entity_mask": (aligned >= 0).astype(np.int32)}


_LAYER = re.compile(r"(?:attention|ffn|knowledge)_(\d+)")


def layer_index(names: Sequence[str]) -> int | str | None:
    """T-Encoder layer i is `attention_i` / `ffn_i`, aggregator j `knowledge_{N + j}`: layers 0 ... N + M − 1."""
    if names and names[0] == "embeddings":
        return layout.EMBEDDINGS
    match = _LAYER.fullmatch(names[0]) if names else None
    return int(match.group(1)) if match else None


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The T-Encoder at every position; each aggregator as a token layer plus an entity layer of
    width entity_size whose feed-forward is the fusion (`intermediate_size` wide: W̃_e in, W_e out);
    the MLM head at the predictions; and, when not nominal, NSP with the pooler and the dEA head at
    every position (Dense H → entity_size and the scores against the candidates)."""
    cfg = encoder_config(config.model)
    length, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    m = cfg.knowledge_layers
    entity = dataclasses.replace(cfg.entity_config(), num_layers=m)
    forward = (flops.stack(dataclasses.replace(cfg, num_layers=cfg.num_layers + m), length, nominal=nominal)
               + flops.stack(entity, length, nominal=nominal) + flops.lm_head(cfg) * predictions / length)
    if not nominal:
        candidates = config.data.max_entities + 1
        forward += flops.sentence_head(cfg) / length + 2 * cfg.hidden_size * cfg.entity_size \
            + 2 * cfg.entity_size * candidates
    return flops.TRAIN * forward


FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, layer_index=layer_index,
                task_modes=("full", "features"), task_trunk=task_trunk, task_inputs=task_inputs,
                task_input_keys=("entity_vectors", "entity_mask"))
