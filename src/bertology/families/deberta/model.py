"""DeBERTa-v3's network: DeBERTa-v2's encoder (He et al. 2021, "DeBERTa: Decoding-enhanced BERT
with Disentangled Attention", arXiv 2006.03654; v3: He et al. 2023, "DeBERTaV3: Improving DeBERTa
using ELECTRA-Style Pre-Training with Gradient-Disentangled Embedding Sharing", arXiv 2111.09543;
reference code github.com/microsoft/DeBERTa and Hugging Face's `DebertaV2ForMaskedLM`,
transformers' `models/deberta_v2/modeling_deberta_v2.py`).

A BERT post-LN encoder in every setting of the shared core (`ARCHITECTURE`), except attention:
- no position table and no segments (v3's `position_biased_input=False`, `type_vocab_size=0`):
  positions enter only through the attention scores;
- disentangled attention (`relative_attention=True`, `pos_att_type=["p2c", "c2p"]`): besides the
  content-to-content q_i·k_j, each score has a content-to-position term q_i·K_r[δ(i,j)] and a
  position-to-content term k_j·Q_r[δ(i,j)], where δ(i,j) is the bucket of i - j (`log_bucket`:
  exact up to half the buckets, logarithmic beyond, up to `max_relative_positions`), and Q_r, K_r
  are one layer-shared relative table (`relative_embeddings`, 2·span rows, LayerNorm'd by
  `relative_norm`: `norm_rel_ebd="layer_norm"`) through each layer's own query and key projections
  (`share_att_key=True`). All three terms are divided by sqrt(3·head width).

The attention terms are the core's generic `ScoreTerms` (`Disentangled`), produced by this
family's `Encoder.score_terms`; the core's attention adds them without knowing their origin. The
MLM head is HF's `DebertaV2LMPredictionHead` (dense, GELU, LayerNorm, the tied token table, a
bias): the shared `MaskedLMHead`.

Pretraining (`pretraining`): `mlm` is this encoder with the MLM head (HF `DebertaV2ForMaskedLM`);
`rtd` is DeBERTa-v3's objective, ELECTRA's replaced-token detection (the `electra` objective) on
ELECTRA's generator/discriminator pair built from this encoder (`families.electra.build`), the
generator as wide as the discriminator and half as deep (`generator_layers`, the paper's setting),
their token tables under gradient-disentangled embedding sharing (`embedding_sharing="gdes"`).
Either way `trunk` is the encoder fine-tuning and export read (under RTD, the discriminator's).

Relative positions are the row's own positions (`positions` when the data packs documents, else
0, 1, ...), so packed documents each start at 0 as HF's unpacked rows do. HF applies the hidden
dropout to the relative table in each layer; here it is drawn once per forward pass and shared by
the layers (no difference at evaluation or with dropout off).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.families.electra import model as electra_model
from bertology.families.roberta import model as roberta
from bertology.models import Family, ModelConfig, encoder_config, fixed_architecture, flops
from bertology.models.transformer import Dropout, ScoreTerms, TransformerConfig, embedding_init, extend, layer_norm
from bertology.models.transformer import Encoder as CoreEncoder

Array = jax.Array

# What makes the core compute DeBERTa-v3 (besides the disentangled attention, which is this family's).
ARCHITECTURE = {
    "norm": "post",
    "norm_kind": "layernorm",
    "embedding_norm": True,
    "use_bias": True,
    "positions": "none",
    "type_vocab_size": 0,
    "pooler": False,
    "scale_attention": True,
    "head_size": None,
    "embedding_size": None,
}


@dataclasses.dataclass(frozen=True)
class Config(TransformerConfig):
    """The core's config plus the relative-position settings (HF's names and v3's values)."""

    position_buckets: int = 256  # > 0: relative distances in log buckets, this many each side; <= 0: none
    max_relative_positions: int = -1  # the distance the last bucket reaches; < 1: max_position_embeddings

    def __post_init__(self):
        super().__post_init__()
        if self.position_buckets > 0 and self.max_relative - 1 <= self.position_buckets // 2:
            raise UserError(f"model.position_buckets={self.position_buckets} needs max_relative_positions (or "
                            f"max_position_embeddings) above {self.position_buckets // 2 + 1}: the log buckets "
                            "span the distances from half the buckets to it")

    @property
    def max_relative(self) -> int:
        """The largest relative distance (HF's `max_relative_positions`, defaulted)."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def span(self) -> int:
        """Relative positions each side the table holds (HF's `pos_ebd_size`); the table has 2·span rows."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative


RELATIVE_KEYS = ("position_buckets", "max_relative_positions")
PRETRAINING = ("mlm", "rtd")
# the relative settings, the pretraining network, and (rtd) ELECTRA's generator keys
EXTRA_KEYS = (*RELATIVE_KEYS, "pretraining", *electra_model.EXTRA_KEYS)


def log_bucket(relative: Array, buckets: int, max_position: int) -> Array:
    """DeBERTa's bucket of each relative position i - j (HF `make_log_bucket_position`): itself
    when |i - j| <= buckets // 2, else mid + ceil(log(|i-j| / mid) / log((max_position - 1) / mid)
    · (mid - 1)) with i - j's sign, mid = buckets // 2: exact nearby, logarithmic far away. Odd in
    i - j. Computed in float32, as HF's."""
    mid = buckets // 2
    sign = jnp.sign(relative)
    far = jnp.where((relative < mid) & (relative > -mid), mid - 1, jnp.abs(relative)).astype(jnp.float32)
    log_pos = jnp.ceil(jnp.log(far / mid) / jnp.log(jnp.float32((max_position - 1) / mid)) * (mid - 1)) + mid
    return jnp.where(far <= mid, relative.astype(jnp.float32), log_pos * sign).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Disentangled:
    """The content-to-position and position-to-content score terms, as `ScoreTerms.fn`: for query
    i and key j with r = clip(δ(i,j) + span, 0, 2·span - 1), c2p = q_i · key(table)[r] and p2c =
    k_j · query(table)[r] (HF computes p2c over -δ(j,i), the same index since δ is odd), both
    divided by sqrt(3·head width). A frozen dataclass so that equal settings compare equal (it is
    static pytree data)."""

    buckets: int
    max_position: int
    span: int

    def __call__(self, inputs: dict[str, Array], q: Array, k: Array, projections: dict[str, Any],
                 rows: Array | None) -> Array:
        table, positions = inputs["table"], inputs["positions"]
        query_positions = positions if rows is None else jnp.take_along_axis(positions, rows, axis=1)
        relative = query_positions[:, :, None] - positions[:, None, :]  # [batch, queries, keys]: i - j
        if self.buckets > 0:
            relative = log_bucket(relative, self.buckets, self.max_position)
        index = jnp.clip(relative + self.span, 0, 2 * self.span - 1)
        pos_key, pos_query = projections["key"](table), projections["query"](table)  # [2·span, heads, head_dim]
        c2p = jnp.einsum("bqhd,rhd->bhqr", q, pos_key, preferred_element_type=jnp.float32)
        p2c = jnp.einsum("bkhd,rhd->bhrk", k, pos_query, preferred_element_type=jnp.float32)
        b, h = c2p.shape[:2]
        index = jnp.broadcast_to(index[:, None], (b, h, *index.shape[1:]))
        terms = jnp.take_along_axis(c2p, index, axis=3) + jnp.take_along_axis(p2c, index, axis=2)
        return terms / math.sqrt(q.shape[-1] * 3)


class Encoder(CoreEncoder):
    """The core encoder with DeBERTa's layer-shared relative table (`relative_embeddings`, its
    `relative_norm`) feeding every self-attention layer's `Disentangled` terms."""

    cfg: Config

    def setup(self):
        super().setup()
        cfg = self.cfg
        self.relative_embeddings = nn.Embed(2 * cfg.span, cfg.hidden_size, dtype=cfg.compute_dtype,
                                            embedding_init=embedding_init(cfg, (None, "embed")))
        self.relative_norm = layer_norm(cfg, "relative_norm")
        self.relative_dropout = Dropout(cfg.dropout_rate)

    def score_terms(self, positions: Array, deterministic: bool) -> ScoreTerms:
        cfg = self.cfg
        table = self.relative_norm(self.relative_embeddings.embedding.astype(cfg.compute_dtype))
        table = self.relative_dropout(table, deterministic=deterministic)
        return ScoreTerms({"table": table, "positions": positions},
                          Disentangled(cfg.position_buckets, cfg.max_relative, cfg.span),
                          scale=1.0 / math.sqrt(cfg.head_dim * 3))


# RoBERTa's MLM model (the MLM head read at the masked positions) on this family's encoder
Model = functools.partial(roberta.Model, stack=Encoder)


def config(model_config: ModelConfig) -> Config:
    """The trunk's config: the block's settings with `ARCHITECTURE` filled in where the block
    leaves it out (a block that sets any of it otherwise is refused), plus the relative settings."""
    block = dict(model_config)
    extra = {k: block.pop(k) for k in EXTRA_KEYS if k in block}
    extra = {k: v for k, v in extra.items() if v is not None and k in RELATIVE_KEYS}
    cfg = fixed_architecture(block, ARCHITECTURE, "DeBERTa-v3", "(post-LN, relative attention only: no position "
                             "table, segments or pooler)")
    return extend(cfg, Config, **extra)


def pretraining(model_config: ModelConfig) -> str:
    """The block's pretraining network: `mlm` (default) or `rtd`."""
    kind = dict(model_config).get("pretraining") or "mlm"
    if kind not in PRETRAINING:
        raise UserError(f"model.pretraining={kind!r} is unknown; use one of {PRETRAINING}")
    return kind


def rtd_block(model_config: ModelConfig) -> dict:
    """The block ELECTRA's builder reads for DeBERTa-v3's RTD: its generator keys defaulted to the
    paper's (as wide, half as deep, GDES, the RTD head) where the block leaves them out."""
    block = dict(model_config)
    defaults = dict(generator_fraction=1.0, generator_layers=max(config(block).num_layers // 2, 1),
                    embedding_sharing="gdes", discriminator_head="rtd")
    return {**block, **{k: v for k, v in defaults.items() if block.get(k) is None}}


def build(model_config: ModelConfig) -> nn.Module:
    """The MLM model, or (`pretraining="rtd"`) ELECTRA's pair on this family's encoder."""
    if pretraining(model_config) == "rtd":
        return electra_model.build(rtd_block(model_config), encoder=Encoder)
    return Model(config(model_config))


def task_trunk(cfg: Config, name: str) -> Encoder:
    """Fine-tuning's trunk: this family's encoder (parameters `trunk(params)`, nothing new)."""
    return Encoder(cfg, name=name)


def trunk(params: dict) -> dict:
    """The encoder: the MLM model's, or the RTD discriminator's (its GDES token table summed)."""
    return electra_model.trunk(params) if "discriminator" in params else params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """RoBERTa's MLM count plus the disentangled terms: each layer projects the 2·span-row table
    through its query and key weights, and every query (c2p) and key (p2c) meets all 2·span rows."""
    cfg = encoder_config(config.model)
    length = config.data.max_seq_length
    h, rows = cfg.hidden_size, 2 * cfg.span

    def relative(layers: int) -> float:
        return flops.TRAIN * layers * (2 * 2 * rows * h * h / length + 2 * 2 * rows * h)

    if pretraining(config.model) == "rtd":  # ELECTRA's count of the pair, plus both stacks' relative terms
        block = rtd_block(config.model)
        rtd = electra_model.flops_per_token(ml_collections.ConfigDict({**config.to_dict(), "model": block}), nominal)
        return rtd + relative(cfg.num_layers + block["generator_layers"])
    return flops.masked_lm(cfg, length, config.data.max_predictions_per_seq, nominal) + relative(cfg.num_layers)


FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, build=build,
                task_trunk=task_trunk)
