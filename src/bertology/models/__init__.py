"""Models picked by name: `config.model.family` names a module here that defines `Model`."""

from __future__ import annotations

import importlib

import flax.linen as nn
import ml_collections

from bertology.errors import UserError
from bertology.models.encoder import EncoderConfig


def encoder_config(model_config: ml_collections.ConfigDict) -> EncoderConfig:
    """EncoderConfig from the config's `model` block (every key but `family`)."""
    fields = {k: v for k, v in model_config.to_dict().items() if k != "family"}
    unknown = sorted(set(fields) - set(EncoderConfig.__dataclass_fields__))
    if unknown:
        raise UserError(f"unknown model config key(s) {unknown}; valid: {sorted(EncoderConfig.__dataclass_fields__)}")
    return EncoderConfig(**fields)


def build(model_config: ml_collections.ConfigDict) -> nn.Module:
    """The `Model` of family `model_config.family` (a module of bertology.models)."""
    family = model_config.family
    try:
        module = importlib.import_module(f"bertology.models.{family}")
    except ModuleNotFoundError:
        raise UserError(f"unknown model family {family!r}; it must name a module in bertology/models/") from None
    return module.Model(encoder_config(model_config))
