"""MobileBERT (Sun et al. 2020): a deep, thin BERT whose blocks run inside a bottleneck.

Built as Hugging Face's `MobileBertForPreTraining` builds it (transformers 4.57
`modeling_mobilebert.py`), so checkpoints move both ways (`interop.py`):
- embeddings: a token table of width `embedding_size` (E, 128 in the paper); with `trigram_input`
  each token's vector is [next token; token; previous token] (zeros past the row's ends), and the
  3E (or E, when E != H) wide input is projected to the inter-block width H; position and segment
  tables are H wide; then the norm and dropout;
- each layer: an input bottleneck H -> `intra_bottleneck_size` (I) whose output is the attention's
  residual; the queries and keys read a second bottleneck of H (`key_query_shared_bottleneck`),
  the values read the H-wide input (all three read the first bottleneck with
  `use_bottleneck_attention`); attention is I wide; then `num_feedforward_networks` - 1 stacked
  FFNs (I -> intermediate -> I, residual, norm) and the last FFN, whose output is projected back
  to H and added to the layer's input (the output bottleneck);
- norms: `normalization_type` "no_norm" (NoNorm: an elementwise scale and shift, the paper's
  latency optimisation) or "layer_norm". HF builds the embedding norm and the last FFN's norm
  with LayerNorm's default eps 1e-5 and every other one with `layer_norm_eps`; kept, so a
  `layer_norm` checkpoint computes the same;
- heads: the MLM transform (H -> H, activation, always a LayerNorm), whose H-wide output meets
  the tied E-wide token table concatenated with `extra` ([H - E, vocab], HF's
  `cls.predictions.dense`), plus a bias; NSP on the pooled first token (dense + tanh when
  `pooler`, HF's `classifier_activation`, else the token itself).

The stack is MobileBERT's own (its blocks have three widths); it reuses the core's dense and norm
helpers, dropout, heads projections and `Mask`, and its attention is the core's `attend` over
its own projections; with the `intermediates` collection mutable it sows its pre-softmax scores
and attention maps as the core's `Attention` does, so distillation reads both networks alike (`families/mobilebert/objective.py`).
Fine-tuning and features (`task_trunk`) run this stack's `Encoder`: its `pooled` is HF's
`MobileBertPooler` (dense + tanh on the first token, or the token itself without
`classifier_activation`), what `MobileBertForSequenceClassification` classifies; `sequence` is what
QA and tagging read. Its config (`config`) is a `TransformerConfig` that carries the `Bottleneck`,
so the trunk is built from the run's `model` block alone.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.models import Family, encoder_config, flops, layout, transformer_config
from bertology.models.attention import GENERAL, attend
from bertology.models.attention import sow as sow_attention
from bertology.models.heads import ClassifierHead, add_vocab_bias
from bertology.models.transformer import (
    Dropout,
    HeadsDense,
    Mask,
    TransformerConfig,
    dense,
    extend,
    gather_positions,
    init,
    inputs,
    layer_norm,
    ones,
    with_first,
    zeros,
)

Array = jax.Array
NORMALIZATIONS = ("no_norm", "layer_norm")
HF_DEFAULT_EPS = 1e-5  # torch LayerNorm's default, which HF leaves on two of MobileBERT's norms


@dataclasses.dataclass(frozen=True)
class Bottleneck:
    """MobileBERT's settings beyond `TransformerConfig` (HF's names and defaults)."""

    intra_bottleneck_size: int = 128
    use_bottleneck: bool = True
    use_bottleneck_attention: bool = False
    key_query_shared_bottleneck: bool = True
    num_feedforward_networks: int = 4
    trigram_input: bool = True
    normalization_type: str = "no_norm"


EXTRA_KEYS = tuple(f.name for f in dataclasses.fields(Bottleneck))
# Core settings this stack does not read: any other value would be silently ignored.
UNSUPPORTED = dict(norm="post", positions="absolute", share_layers="none", scan_layers=False, head_size=None,
                   adapter_size=None, embedding_norm=True, scale_embeddings=False, scale_attention=True,
                   position_offset=0, norm_kind="layernorm", activation_dropout_rate=0.0)


def settings(model_config: ml_collections.ConfigDict | dict) -> Bottleneck:
    """The `Bottleneck` of a `model` block, checked."""
    block = dict(model_config)
    b = Bottleneck(**{k: block[k] for k in EXTRA_KEYS if k in block and block[k] is not None})
    if b.normalization_type not in NORMALIZATIONS:
        raise UserError(f"model.normalization_type={b.normalization_type!r} is unknown; use one of {NORMALIZATIONS}")
    if b.num_feedforward_networks < 1:
        raise UserError(f"model.num_feedforward_networks={b.num_feedforward_networks}; MobileBERT needs at least 1")
    return b


def true_width(cfg: TransformerConfig, b: Bottleneck) -> int:
    """The width inside a block: the intra-bottleneck size, or H without bottlenecks."""
    return b.intra_bottleneck_size if b.use_bottleneck else cfg.hidden_size


def norm(cfg: TransformerConfig, b: Bottleneck, name: str, eps: float | None = None) -> nn.Module:
    """NoNorm or LayerNorm (with `eps`, default `layer_norm_eps`), per `normalization_type`."""
    if b.normalization_type == "no_norm":
        return NoNorm(name=name)
    return layer_norm(cfg if eps is None else dataclasses.replace(cfg, layer_norm_eps=eps), name)


class NoNorm(nn.Module):
    """x · scale + bias, elementwise: MobileBERT's replacement for LayerNorm (no statistics to
    compute at inference). Named like LayerNorm's parameters, so optimizers skip their decay."""

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", ones(("embed",)), (x.shape[-1],), jnp.float32)
        bias = self.param("bias", zeros(("embed",)), (x.shape[-1],), jnp.float32)
        return x * scale.astype(x.dtype) + bias.astype(x.dtype)


def _width(cfg: TransformerConfig, width: int, head_dim: int) -> TransformerConfig:
    """`cfg` with hidden size `width`: the core's heads projections then read (or write) that width."""
    return dataclasses.replace(cfg, hidden_size=width, head_size=head_dim)


class Embeddings(nn.Module):
    cfg: TransformerConfig
    b: Bottleneck

    def setup(self):
        cfg, b = self.cfg, self.b
        self.token = nn.Embed(cfg.padded_vocab_size, cfg.embed_dim, dtype=cfg.compute_dtype,
                              embedding_init=init(cfg, ("vocab", "embed")), name="token")
        table = dict(features=cfg.hidden_size, dtype=cfg.compute_dtype, embedding_init=init(cfg, (None, "embed")))
        self.position = nn.Embed(cfg.max_position_embeddings, **table, name="position")
        if cfg.type_vocab_size:
            self.segment = nn.Embed(cfg.type_vocab_size, **table, name="segment")
        if self.projected:
            self.transformation = dense(cfg, cfg.hidden_size, ("embed", "hidden"), "transformation")
        self.norm = norm(cfg, b, "norm", HF_DEFAULT_EPS)
        self.dropout = Dropout(cfg.dropout_rate)

    @property
    def projected(self) -> bool:
        return self.b.trigram_input or self.cfg.embed_dim != self.cfg.hidden_size

    def __call__(self, batch: dict[str, Array], deterministic: bool) -> Array:
        ids, segments, positions = inputs(batch)
        x = self.token(ids)
        if self.b.trigram_input:
            zero = jnp.zeros_like(x[:, :1])
            after, before = jnp.concatenate([x[:, 1:], zero], 1), jnp.concatenate([zero, x[:, :-1]], 1)
            docs = batch.get("packing_ids")
            if docs is not None:  # packed rows: a neighbour in another document is no neighbour
                pad = jnp.full_like(docs[:, :1], -1)
                after = after * (jnp.concatenate([docs[:, 1:], pad], 1) == docs)[..., None]
                before = before * (jnp.concatenate([pad, docs[:, :-1]], 1) == docs)[..., None]
            x = jnp.concatenate([after, x, before], axis=-1)
        if self.projected:
            x = self.transformation(x)
        x = x + self.position(positions)
        if self.cfg.type_vocab_size:
            x = x + self.segment(segments)
        return self.dropout(self.norm(x), deterministic=deterministic)

class Attention(nn.Module):
    """Self-attention of width I over queries, keys and values that may differ in width, its
    output projection, the residual (`residual`, the input bottleneck's output) and the norm."""

    cfg: TransformerConfig
    b: Bottleneck

    @nn.compact
    def __call__(self, qk: Array, values: Array, residual: Array, mask: Mask, deterministic: bool,
                 rows: Array | None) -> Array:
        cfg, b = self.cfg, self.b
        width = true_width(cfg, b)
        if width % cfg.num_heads:
            raise UserError(f"the attention width {width} is not divisible by num_heads {cfg.num_heads}; "
                            "pick num_heads that divides model.intra_bottleneck_size")
        d = width // cfg.num_heads
        queries = qk if rows is None else gather_positions(qk, rows)
        if rows is not None:
            residual = gather_positions(residual, rows)
        q = HeadsDense(_width(cfg, qk.shape[-1], d), to_heads=True, name="query")(queries)
        k = HeadsDense(_width(cfg, qk.shape[-1], d), to_heads=True, name="key")(qk)
        v = HeadsDense(_width(cfg, values.shape[-1], d), to_heads=True, name="value")(values)
        allowed, _ = mask.lower(rows)
        sow_attention(self, q, k, allowed, False)  # as the core's layers do (distillation, attention maps)
        drop = Dropout(cfg.attention_dropout_rate)  # built even when unused: the output dropout's name follows it
        dropout = (None if deterministic or cfg.attention_dropout_rate == 0.0
                   else lambda probs: drop(probs.astype(q.dtype), deterministic=False))
        fused = GENERAL if cfg.attention_backend == "xla" else mask.fused(q.shape[1], rows)
        ctx = attend(q, k, v, allowed=allowed, dropout=dropout, backend=cfg.attention_backend, fused=fused)
        out = HeadsDense(_width(cfg, width, d), to_heads=False, name="output")(ctx)
        if not b.use_bottleneck:
            out = Dropout(cfg.dropout_rate)(out, deterministic=deterministic)
        return norm(cfg, b, "norm")(out + residual)


class FeedForward(nn.Module):
    """I -> intermediate -> I, the residual and the norm; `last`: the layer's final FFN, whose
    dropout and norm epsilon follow HF's `MobileBertOutput` (the stacked ones have neither)."""

    cfg: TransformerConfig
    b: Bottleneck
    last: bool = False

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg, b = self.cfg, self.b
        h = cfg.act(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x))
        h = dense(cfg, true_width(cfg, b), ("mlp", "embed"), "output")(h)
        if self.last and not b.use_bottleneck:
            h = Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
        return norm(cfg, b, "norm", HF_DEFAULT_EPS if self.last else None)(h + x)


class Layer(nn.Module):
    cfg: TransformerConfig
    b: Bottleneck

    @nn.compact
    def __call__(self, x: Array, mask: Mask, deterministic: bool, rows: Array | None = None) -> Array:
        """The layer's H-wide output (at `rows` only, when given: the queries, FFNs and residuals
        run there; keys and values still span the sequence)."""
        cfg, b = self.cfg, self.b
        qk = values = residual = x
        if b.use_bottleneck:
            bottleneck = lambda name: norm(cfg, b, f"{name}_norm")(  # noqa: E731
                dense(cfg, b.intra_bottleneck_size, ("embed", "hidden"), name)(x))
            residual = bottleneck("bottleneck")
            if b.key_query_shared_bottleneck:  # HF builds it with use_bottleneck_attention too, unused (XLA drops it)
                qk = bottleneck("shared_bottleneck")
            if b.use_bottleneck_attention:
                qk = values = residual
        h = Attention(cfg, b, name="attention")(qk, values, residual, mask, deterministic, rows)
        for j in range(b.num_feedforward_networks - 1):
            h = FeedForward(cfg, b, name=f"ffn_{j}")(h, deterministic)
        h = FeedForward(cfg, b, last=True, name="ffn_last")(h, deterministic)
        if not b.use_bottleneck:
            return h
        out = dense(cfg, cfg.hidden_size, ("embed", "hidden"), "output_bottleneck")(h)
        out = Dropout(cfg.dropout_rate)(out, deterministic=deterministic)
        inputs_at = x if rows is None else gather_positions(x, rows)
        return norm(cfg, b, "output_bottleneck_norm")(out + inputs_at)


class Encoder(nn.Module):
    """Embeddings, layers, pooler; returns `sequence`, `pooled` and every layer's output
    (embeddings first), as the core `Encoder` does (with `outputs_at`, see there)."""

    cfg: TransformerConfig
    b: Bottleneck

    def setup(self):
        cfg = self.cfg
        self.embeddings = Embeddings(cfg, self.b, name="embeddings")
        self.layers = [Layer(cfg, self.b, name=f"layer_{i}") for i in range(cfg.num_layers)]
        if cfg.pooler:
            self.pooler = dense(cfg, cfg.hidden_size, ("embed", "hidden"), "pooler")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 outputs_at: Array | None = None) -> dict[str, Array]:
        x = self.embeddings(batch, deterministic)
        mask = Mask.from_batch(batch)
        layers = [x]
        rows = None if outputs_at is None else with_first(outputs_at)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, deterministic, rows if i == len(self.layers) - 1 else None)
            layers.append(x)
        first = x[:, 0]
        if rows is not None:
            x = layers[-1] = x[:, 1:]
        pooled = jnp.tanh(self.pooler(first)) if self.cfg.pooler else first
        return {"sequence": x, "pooled": pooled, "layers": layers}

    def transfer(self, batch: dict[str, Array], layer: int, *, deterministic: bool = True) -> Array:
        """Layer `layer`'s output, its input behind `stop_gradient`: a progressive transfer stage
        trains that layer alone (and the embeddings at layer 0, which a plain BERT teacher of
        another embedding shape cannot give), and the layers above do not run."""
        x = self.embeddings(batch, deterministic)
        mask = Mask.from_batch(batch)
        for below in self.layers[:layer]:
            x = below(x, mask, deterministic)
        if layer:
            x = jax.lax.stop_gradient(x)
        return self.layers[layer](x, mask, deterministic)

class MaskedLMHead(nn.Module):
    """Dense + activation + LayerNorm at width H, then logits against [token table; extra]."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, hidden: Array, table: Array) -> Array:
        cfg = self.cfg
        x = layer_norm(cfg, "norm")(cfg.act(dense(cfg, cfg.hidden_size, ("hidden", "embed"), "transform")(hidden)))
        extra = self.param("extra", init(cfg, (None, "vocab")), (cfg.hidden_size - cfg.embed_dim, cfg.padded_vocab_size))
        weights = jnp.concatenate([table.T, extra], axis=0).astype(x.dtype)
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,), jnp.float32)
        return cfg.real_logits(add_vocab_bias((x @ weights).astype(jnp.float32), bias))


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, max_predictions, vocab] and `nsp_logits` [batch, 2], as BERT's
    `Model` does, so BERT's objective and data train it unchanged."""

    cfg: TransformerConfig
    b: Bottleneck

    def setup(self):
        self.encoder = Encoder(self.cfg, self.b, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.nsp = ClassifierHead(self.cfg, num_classes=2, name="nsp")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        out = self.encoder(batch, deterministic=deterministic, outputs_at=batch["masked_positions"])
        table = self.encoder.embeddings.token.embedding
        return {"mlm_logits": self.mlm(out["sequence"], table), "nsp_logits": self.nsp(out["pooled"])}


@dataclasses.dataclass(frozen=True)
class Config(TransformerConfig):
    """The trunk's config (`config`): the core settings and the `Bottleneck`. Fine-tuning and
    features get a family's trunk config from the `model` block alone (`models.encoder_config`),
    and MobileBERT's stack cannot be rebuilt without its block widths."""

    bottleneck: Bottleneck = Bottleneck()


def config(model_config: ml_collections.ConfigDict | dict) -> Config:
    """The `model` block's config, checked: core settings the stack does not read must keep their defaults."""
    cfg = transformer_config(model_config, EXTRA_KEYS)
    for key, want in UNSUPPORTED.items():
        if getattr(cfg, key) != want:
            raise UserError(f"model.{key}={getattr(cfg, key)!r} is not read by MobileBERT's stack; "
                            f"leave it at {want!r}")
    if cfg.embed_dim > cfg.hidden_size:
        raise UserError(f"model.embedding_size={cfg.embed_dim} exceeds hidden_size={cfg.hidden_size}; MobileBERT's "
                        "output layer needs embedding_size <= hidden_size")
    return extend(cfg, Config, bottleneck=settings(model_config))


def build(model_config: ml_collections.ConfigDict | dict) -> Model:
    cfg = config(model_config)
    return Model(cfg, cfg.bottleneck)


def task_trunk(cfg: Config, name: str) -> Encoder:
    """The fine-tuning trunk of the family contract (`bertology.models`): the pretraining stack's
    `Encoder` (parameters `trunk(params)`, nothing new), pooled by its own pooler."""
    return Encoder(cfg, cfg.bottleneck, name=name)


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Matmul FLOPs of the stack at every token (the last layer too), the MLM head at the
    predictions and NSP; `nominal` counts the stack and the MLM head only."""
    cfg, b = encoder_config(config.model), settings(config.model)
    h, e, i, f = cfg.hidden_size, cfg.embed_dim, true_width(cfg, b), cfg.intermediate_size
    length, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    qk_in = i if b.use_bottleneck_attention or b.key_query_shared_bottleneck else h
    v_in = i if b.use_bottleneck_attention else h
    bottlenecks = (2 * h * i * (1 + (b.key_query_shared_bottleneck and not b.use_bottleneck_attention))
                   + 2 * i * h) if b.use_bottleneck else 0
    layer = (bottlenecks + 2 * 2 * qk_in * i + 2 * v_in * i + 2 * i * i + 2 * 2 * length * i
             + b.num_feedforward_networks * 2 * 2 * i * f)
    stack = cfg.num_layers * layer + (2 * (3 if b.trigram_input else 1) * e * h if not nominal else 0)
    head = (2 * h * h + 2 * h * cfg.vocab_size) * predictions / length
    sentence = 0 if nominal else flops.sentence_head(cfg) / length
    return flops.TRAIN * (stack + head + sentence)


# Its bottlenecked stack has no Houlsby adapters; its layers are whole modules `layer_{i}`.
FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, config=config, build=build,
                layer_index=layout.numbered("layer_"), task_modes=("full", "features"), task_trunk=task_trunk)
