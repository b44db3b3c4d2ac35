"""Models picked by name: `config.model.family` names a module here that defines `Model`."""

from __future__ import annotations

import importlib
from types import ModuleType

import flax.linen as nn
import ml_collections

from bertology.errors import UserError
from bertology.models.encoder import EncoderConfig


def _family(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"bertology.models.{name}")
    except ModuleNotFoundError:
        raise UserError(f"unknown model family {name!r}; it must name a module in bertology/models/") from None


def encoder_config(model_config: ml_collections.ConfigDict | dict) -> EncoderConfig:
    """EncoderConfig from the config's `model` block: every key but `family` and the family's own
    extra keys (`EXTRA_KEYS` of its module, e.g. ELECTRA's generator_fraction)."""
    model_config = dict(model_config)
    extra = {"family", *getattr(_family(model_config["family"]), "EXTRA_KEYS", ())}
    fields = {k: v for k, v in model_config.items() if k not in extra}
    unknown = sorted(set(fields) - set(EncoderConfig.__dataclass_fields__))
    if unknown:
        raise UserError(f"unknown model config key(s) {unknown}; valid: {sorted(EncoderConfig.__dataclass_fields__)}")
    return EncoderConfig(**fields)


def build(model_config: ml_collections.ConfigDict) -> nn.Module:
    """The `Model` of family `model_config.family` (a module of bertology.models); a module with
    more than an encoder config to read defines `from_config(encoder_config, model_config)`."""
    module = _family(model_config.family)
    cfg = encoder_config(model_config)
    if hasattr(module, "from_config"):
        return module.from_config(cfg, model_config)
    return module.Model(cfg)


def pretrained_encoder(params: dict, model_config: ml_collections.ConfigDict | dict) -> tuple[EncoderConfig, dict]:
    """The trunk of a pretraining run, for fine-tuning or features: (its EncoderConfig, its params).

    Every family keeps a complete encoder under `encoder`; ELECTRA fine-tunes its discriminator's.
    """
    cfg = encoder_config(model_config)
    if "discriminator" in params:
        return cfg, params["discriminator"]["encoder"]
    return cfg, params["encoder"]
