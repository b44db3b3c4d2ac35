"""ELECTRA: a small MLM generator and a discriminator that share token and position embeddings.

The generator's width is `generator_fraction` of the discriminator's (heads = H/64, FF = 4H),
and both read the discriminator's embedding tables (in E dimensions, each projecting to its own
H). Sampling replacements sits in the objective, between the two calls below, so the model stays
a pure function and no gradient can flow through the sampled tokens.

Parameters: `discriminator/encoder` is a complete encoder (embeddings included), so fine-tuning
and export take the discriminator alone; `generator/encoder` has no embedding tables.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.models import Family, encoder_config, flops
from bertology.models.heads import MaskedLMHead
from bertology.models.transformer import Embeddings, Encoder, TransformerConfig, dense

Array = jax.Array
EXTRA_KEYS = ("generator_fraction", "discriminator_head")


def generator_config(cfg: TransformerConfig, fraction: float) -> TransformerConfig:
    """The generator's shape: hidden = fraction·H, heads = hidden/64 (at least 1), FF = 4·hidden.

    The embedding width stays the discriminator's (E, or H when unfactorized) so the tables are shared.
    """
    hidden = max(round(cfg.hidden_size * fraction), 1)
    heads = max(hidden // 64, 1)
    return dataclasses.replace(
        cfg,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=4 * hidden,
        embedding_size=cfg.embed_dim if cfg.embed_dim != hidden else None,
    )


def build(model_config: ml_collections.ConfigDict | dict) -> "Model":
    cfg, model_config = encoder_config(model_config), dict(model_config)
    return Model(cfg, generator_config(cfg, model_config.get("generator_fraction", 0.25)),
                 model_config.get("discriminator_head", "rtd"))


def trunk(params: dict) -> dict:
    """The discriminator's encoder: what fine-tuning and export take."""
    return params["discriminator"]["encoder"]


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


class Discriminator(nn.Module):
    """Encoder plus its head. `rtd` (ELECTRA): per token, dense + GELU + dense to one logit, 'was
    this token replaced?'. `mlm` (the paper's Replace-MLM and All-tokens-MLM ablations): an MLM
    head at `positions` predicting the original tokens."""

    cfg: TransformerConfig
    head: str = "rtd"

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
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
    embeddings: Embeddings

    def setup(self):
        self.encoder = Encoder(self.cfg, shared_embeddings=self.embeddings, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")

    def __call__(self, batch: dict[str, Array], deterministic: bool) -> Array:
        out = self.encoder(batch, deterministic=deterministic, outputs_at=batch["masked_positions"])
        return self.mlm(out["sequence"], self.encoder.attend)


class Model(nn.Module):
    """`generate(batch)` -> MLM logits at masked positions; `discriminate(batch)` -> per-token logits."""

    cfg: TransformerConfig
    generator_cfg: TransformerConfig
    discriminator_head: str = "rtd"  # rtd | mlm

    def setup(self):
        if self.discriminator_head not in ("rtd", "mlm"):
            raise UserError(f"model.discriminator_head={self.discriminator_head!r} is unknown; use 'rtd' or 'mlm'")
        self.discriminator = Discriminator(self.cfg, self.discriminator_head, name="discriminator")
        self.generator = Generator(self.generator_cfg, self.discriminator.encoder.embeddings, name="generator")

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
