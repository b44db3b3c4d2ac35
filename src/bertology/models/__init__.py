"""Models picked by name: `config.model.family` names a module here.

The family contract — what a module `bertology/models/<family>.py` states, so that nothing
outside it ever asks which family it is:
- `Model`, the flax module, and `build(model_config) -> Model` when it reads more than its
  `TransformerConfig` (ELECTRA's generator width); otherwise `Model(config(model_config))`;
- `EXTRA_KEYS`: the family's own keys of the `model` block, beyond `TransformerConfig`'s fields
  (or `config(model_config)` for a family that is not a Transformer);
- `trunk(params) -> params`: the network that fine-tuning, features and export read (its
  `TransformerConfig` is `config(model_config)`);
- `init_from(params, fresh) -> params` (optional): how a run of this family starts from
  another family's checkpoint (`--config.init_checkpoint`; UniLM and bert2bert from BERT);
- `from_teacher(teacher_params, fresh) -> params` (optional): a distillation student's start
  from its frozen teacher (`--config.teacher_checkpoint`; DistilBERT takes every other layer);
- `initial_carry(model_config, batch_size) -> pytree` (optional): the zero state a recurrent
  family carries from one batch to the next on contiguous data (Transformer-XL and XLNet memory,
  ELMo's LSTM states; `bertology.train.step`, `bertology.data.lanes`);
- `task_trunk(cfg, name: str) -> flax.linen.Module` (optional): the fine-tuning trunk, built under
  `name` with `cfg` = `config(model_config)` (or the TransformerConfig); its
  `__call__(inputs: dict, *, deterministic: bool)` returns {"sequence": [B, L, D], "pooled": [B, D]
  (what sequence-level heads read: BERT's pooler, XLNet's summary of its last `<cls>`), "layers":
  list of [B, L, D]}, and its parameters are `trunk(params)` plus whatever only fine-tuning trains.
  Families without it get the shared `Encoder` (`bertology.models.tasks.TaskModel`);
- `TASK_MODES` (optional): the fine-tuning modes its trunk takes, of `full`, `adapters`, `features`
  (default all; ELMo's biLM is used frozen: `features` only; a trunk without Houlsby adapters
  leaves out `adapters`);
- `task_inputs(cfg, tokenizer, arrays) -> arrays` (optional): extra inputs a non-Transformer
  trunk needs in fine-tuning (ELMo's character ids);
- `flops_per_token(config, nominal) -> float`: training FLOPs per input token of a run config
  (`bertology.models.flops`): what runs, or with `nominal` the paper-style estimate that the
  equal-FLOP sweep budgets with.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import flax.linen as nn
import ml_collections

from bertology.errors import UserError
from bertology.models.transformer import TransformerConfig

ModelConfig = ml_collections.ConfigDict | dict


def family(name: str) -> ModuleType:
    """The module of family `name`."""
    try:
        return importlib.import_module(f"bertology.models.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"bertology.models.{name}":
            raise
        raise UserError(f"unknown model family {name!r}; it must name a module in bertology/models/") from None


def transformer_config(model_config: ModelConfig, extra_keys: tuple[str, ...] = ()) -> TransformerConfig:
    """TransformerConfig from a `model` block: every key but `family` and `extra_keys`."""
    fields = {k: v for k, v in dict(model_config).items() if k not in {"family", *extra_keys}}
    unknown = sorted(set(fields) - set(TransformerConfig.__dataclass_fields__))
    if unknown:
        raise UserError(f"unknown model config key(s) {unknown}; valid: {sorted(TransformerConfig.__dataclass_fields__)}")
    return TransformerConfig(**fields)


def encoder_config(model_config: ModelConfig) -> Any:
    """The trunk's config of a `model` block (a TransformerConfig for every Transformer family)."""
    module = family(dict(model_config)["family"])
    if hasattr(module, "config"):
        return module.config(model_config)
    return transformer_config(model_config, getattr(module, "EXTRA_KEYS", ()))


def build(model_config: ModelConfig) -> nn.Module:
    """The `Model` of family `model_config['family']`."""
    module = family(dict(model_config)["family"])
    if hasattr(module, "build"):
        return module.build(model_config)
    return module.Model(encoder_config(model_config))


def pretrained_encoder(params: dict, model_config: ModelConfig) -> tuple[Any, dict]:
    """The trunk of a pretraining run, for fine-tuning or features: (its config, its params)."""
    return encoder_config(model_config), family(dict(model_config)["family"]).trunk(params)


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Training FLOPs per input token of a run config (`model.vocab_size` must be set)."""
    return family(config.model.family).flops_per_token(config, nominal)
