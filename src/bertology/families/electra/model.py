"""ELECTRA: a small MLM generator and a discriminator that share token and position embeddings.

The generator's width is `generator_fraction` of the discriminator's (heads = H/64, FF = 4H),
and both read the discriminator's embedding tables (in E dimensions, each projecting to its own
H). Sampling replacements sits in the objective, between the two calls below, so the model stays
a pure function and no gradient can flow through the sampled tokens.

Parameters: `discriminator/encoder` is a complete encoder (embeddings included), so fine-tuning
and export take the discriminator alone; `generator/encoder` has no embedding tables.

`embedding_sharing="gdes"` is DeBERTa-v3's gradient-disentangled embedding sharing (He et al.
2023, arXiv 2111.09543, section 3.2): the generator owns its embeddings (a complete encoder), and
the discriminator's token table is stop_gradient(the generator's) + its own `token_delta`
(initialised at zero), so the discriminator's loss never pulls the generator's table while the
generator's MLM loss still trains it; every other embedding tensor is the discriminator's own.
`trunk` then hands fine-tuning the discriminator with the summed table. `encoder` is the stack
class both networks use (the core `Encoder`, or a family's subclass such as DeBERTa's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.models import Family, encoder_config, flops
from bertology.models.heads import MaskedLMHead
from bertology.models.transformer import Embeddings, Encoder, TransformerConfig, dense, zeros

Array = jax.Array
EXTRA_KEYS = ("generator_fraction", "discriminator_head", "generator_layers", "embedding_sharing")
SHARING = ("all", "gdes")  # the generator reads the discriminator's tables | gradient-disentangled (DeBERTa-v3)


def generator_config(cfg: TransformerConfig, fraction: float, layers: int | None = None) -> TransformerConfig:
    """The generator's shape: hidden = fraction·H, heads = hidden/64 (at least 1), FF = 4·hidden,
    `layers` deep (None: as deep as the discriminator; DeBERTa-v3's is half as deep, as wide).

    The embedding width stays the discriminator's (E, or H when unfactorized) so the tables are shared.
    """
    hidden = max(round(cfg.hidden_size * fraction), 1)
    heads = max(hidden // 64, 1)
    return dataclasses.replace(
        cfg,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=4 * hidden,
        num_layers=cfg.num_layers if layers is None else layers,
        embedding_size=cfg.embed_dim if cfg.embed_dim != hidden else None,
    )


def build(model_config: ml_collections.ConfigDict | dict, encoder: Any = Encoder) -> "Model":
    """The model of a `model` block; `encoder`: the stack class (a family's `Encoder` subclass)."""
    cfg, model_config = encoder_config(model_config), dict(model_config)
    gen = generator_config(cfg, model_config.get("generator_fraction") or 0.25, model_config.get("generator_layers"))
    return Model(cfg, gen, model_config.get("discriminator_head") or "rtd",
                 model_config.get("embedding_sharing") or "all", encoder)


def trunk(params: dict) -> dict:
    """The discriminator's encoder: what fine-tuning and export take. Under GDES its token table is
    the sum the discriminator computes with: the generator's table + `token_delta`."""
    disc = params["discriminator"]["encoder"]
    if "token_delta" not in params:
        return disc
    table = params["generator"]["encoder"]["embeddings"]["token"]["embedding"] + params["token_delta"]["delta"]
    return {**disc, "embeddings": {**disc["embeddings"], "token": {"embedding": table}}}


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The generator (MLM at the masked positions), and the discriminator over every token with
    its per-token head (dense H->H, then one unit); the MLM-head ablations count as an MLM."""
    model = build(config.model)
    length, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    generator = flops.masked_lm(model.generator_cfg, length, predictions, nominal)
    if model.discriminator_head == "mlm":
        return generator + flops.masked_lm(model.cfg, length, predictions, nominal)
    h = model.cfg.hidden_size
    return generator + flops.TRAIN * (flops.stack(model.cfg, length, nominal=nominal) + 2 * h * h + 2 * h)


class DisentangledTokens(nn.Module):
    """GDES's discriminator token table, used like an `nn.Embed`: stop_gradient(`source`'s table,
    the generator's) + `delta` (zero at initialisation, so both networks start from one table)."""

    cfg: TransformerConfig
    source: nn.Embed

    def setup(self):
        self.delta = self.param("delta", zeros(("vocab", "embed")), (self.cfg.padded_vocab_size, self.cfg.embed_dim))

    def table(self) -> Array:
        return (jax.lax.stop_gradient(self.source.embedding) + self.delta).astype(self.cfg.compute_dtype)

    def __call__(self, ids: Array) -> Array:
        return jnp.take(self.table(), ids, axis=0)

    def attend(self, x: Array) -> Array:
        return jnp.dot(x, self.table().T)


class Discriminator(nn.Module):
    """Encoder plus its head. `rtd` (ELECTRA): per token, dense + GELU + dense to one logit, 'was
    this token replaced?'. `mlm` (the paper's Replace-MLM and All-tokens-MLM ablations): an MLM
    head at `positions` predicting the original tokens."""

    cfg: TransformerConfig
    head: str = "rtd"
    encoder_cls: Any = Encoder
    shared_tokens: Any = None  # GDES: the discriminator's token table (`DisentangledTokens`)

    def setup(self):
        self.encoder = self.encoder_cls(self.cfg, shared_tokens=self.shared_tokens, name="encoder")
        if self.head == "rtd":
            self.dense = dense(self.cfg, self.cfg.hidden_size, ("embed", "hidden"), "dense")
            self.prediction = dense(self.cfg, 1, ("hidden", None), "prediction")
        else:
            self.mlm = MaskedLMHead(self.cfg, name="mlm")

    def __call__(self, batch: dict[str, Array], deterministic: bool, positions: Array | None = None) -> Array:
        outputs_at = None if self.head == "rtd" else positions  # RTD reads every token
        out = self.encoder(batch, deterministic=deterministic, outputs_at=outputs_at)
        if self.head == "rtd":
            h = self.cfg.act(self.dense(out["sequence"]))
            return self.prediction(h)[..., 0].astype(jnp.float32)
        return self.mlm(out["sequence"], self.encoder.attend)


class Generator(nn.Module):
    """A narrow encoder on the discriminator's embeddings, with an MLM head at the masked positions."""

    cfg: TransformerConfig
    embeddings: Embeddings | None  # None (GDES): its own
    encoder_cls: Any = Encoder

    def setup(self):
        self.encoder = self.encoder_cls(self.cfg, shared_embeddings=self.embeddings, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")

    def __call__(self, batch: dict[str, Array], deterministic: bool) -> Array:
        out = self.encoder(batch, deterministic=deterministic, outputs_at=batch["masked_positions"])
        return self.mlm(out["sequence"], self.encoder.attend)


class Model(nn.Module):
    """`generate(batch)` -> MLM logits at masked positions; `discriminate(batch)` -> per-token logits."""

    cfg: TransformerConfig
    generator_cfg: TransformerConfig
    discriminator_head: str = "rtd"  # rtd | mlm
    embedding_sharing: str = "all"  # all (ELECTRA) | gdes (DeBERTa-v3)
    encoder: Any = Encoder  # the stack class of both networks

    def setup(self):
        if self.discriminator_head not in ("rtd", "mlm"):
            raise UserError(f"model.discriminator_head={self.discriminator_head!r} is unknown; use 'rtd' or 'mlm'")
        if self.embedding_sharing not in SHARING:
            raise UserError(f"model.embedding_sharing={self.embedding_sharing!r} is unknown; use one of {SHARING}")
        if self.embedding_sharing == "gdes":
            if self.cfg.embed_dim != self.generator_cfg.embed_dim:
                raise UserError("model.embedding_sharing='gdes' sums the generator's token table into the "
                                "discriminator's: both need the same embedding width")
            self.generator = Generator(self.generator_cfg, None, self.encoder, name="generator")
            self.token_delta = DisentangledTokens(self.cfg, self.generator.encoder.embeddings.token)
            self.discriminator = Discriminator(self.cfg, self.discriminator_head, self.encoder, self.token_delta,
                                               name="discriminator")
            return
        self.discriminator = Discriminator(self.cfg, self.discriminator_head, self.encoder, name="discriminator")
        self.generator = Generator(self.generator_cfg, self.discriminator.encoder.embeddings, self.encoder,
                                   name="generator")

    def generate(self, batch: dict[str, Array], *, deterministic: bool = True) -> Array:
        return self.generator(batch, deterministic)

    def discriminate(self, batch: dict[str, Array], *, deterministic: bool = True,
                     positions: Array | None = None) -> Array:
        """Per-token replaced logits [batch, length] (rtd), or MLM logits at `positions` (mlm)."""
        return self.discriminator(batch, deterministic, positions)

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        """Both networks on the same (uncorrupted) batch; used to create every parameter at init."""
        return {"mlm_logits": self.generate(batch, deterministic=deterministic),
                "disc_logits": self.discriminate(batch, deterministic=deterministic, positions=batch["masked_positions"])}


FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, build=build)
