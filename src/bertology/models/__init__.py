"""The core every family is built from, and the `Family` record by which shared code reaches a
family: `config.model.family` names a package `bertology/families/<name>/`, whose `FAMILY`
record says everything shared code may ask of the family, so that nothing outside it asks which
family it is.

A family's `model.py` states `FAMILY = Family(...)` (see `Family` for each field); `family(name)`
finds it. Shared code calls the record's fields and methods and never imports a family package,
tests a family's type or compares its name. This package (transformer.py, heads, decoding,
layout, FLOP counter, fine-tuning heads) knows no family.
"""

from __future__ import annotations

import dataclasses
import importlib
from importlib import resources
from typing import Any, Callable, TypeAlias

import flax.linen as nn
import ml_collections

from bertology.errors import UserError
from bertology.models import layout
from bertology.models.transformer import TransformerConfig

ModelConfig: TypeAlias = "ml_collections.ConfigDict | dict"
TASK_MODES = ("full", "adapters", "features")  # how fine-tuning trains a trunk (bertology.models.tasks)


@dataclasses.dataclass(frozen=True)
class Family:
    """One family's contract with the shared code.

    - `model`: the flax module, built from the trunk config (`config`) unless `build` is given;
    - `trunk(params) -> params`: the network that fine-tuning, features and export read;
    - `flops_per_token(config, nominal) -> float`: training FLOPs per input token of a run config
      (`bertology.models.flops`): what runs, or with `nominal` the paper-style estimate that the
      equal-FLOP sweep budgets with;
    - `extra_keys`: the family's own keys of the `model` block, beyond `TransformerConfig`'s;
    - `config(model_block)`: the trunk's config, where it is not the block's `TransformerConfig`
      (ELMo's, the LSTMs', MobileBERT's bottlenecks, the recurrent Transformers');
    - `build(model_block)`: the model, where it reads more than the trunk config (ELECTRA's
      generator width, T5's tying);
    - `layer_index(names)`: where a trunk parameter sits among the layers (`bertology.models.layout`);
      read by layer-wise learning rates, pruning and student initialisation;
    - `task_modes`: the fine-tuning modes its trunk takes (ELMo's biLM is used frozen: `features`
      only; a trunk without Houlsby adapters leaves out `adapters`; none: the family has no
      fine-tuning trunk, and fine-tuning and features refuse its runs in one line);
    - `task_trunk(cfg, name) -> nn.Module`: the fine-tuning trunk where it is not the shared
      `Encoder`; its `__call__(inputs, *, deterministic)` returns {"sequence": [B, L, D], "pooled":
      [B, D] (what sequence-level heads read), "layers": list of [B, L, D]}, and its parameters are
      `trunk(params)` plus whatever only fine-tuning trains;
    - `task_inputs(cfg, tokenizer, arrays, kind) -> arrays`: the rows with the extra inputs its trunk
      needs, given the task's head kind (`bertology.tasks.kinds`; None where no task reads the trunk,
      `bertology.features`): ELMo's characters; Longformer's global-attention mask, put where the
      kind wants it;
    - `task_input_keys`: the arrays `task_inputs` adds; they reach the trunk beside the ids
      (`bertology.models.tasks.input_keys`), every other array of a row stays with the head;
    - `reads_words`: the trunk reads whole words (ELMo's characters), not the tokenizer's sub-word
      pieces, so the tools that locate or encode pieces (word lists in `bertology.features`,
      contextual similarity) refuse its runs in one line;
    - `init_from(params, fresh) -> params`: how a run starts from another family's checkpoint
      (`--config.init_checkpoint`; UniLM and bert2bert from BERT);
    - `from_teacher(teacher_params, fresh) -> params`: a distillation student's start from its
      frozen teacher (`--config.teacher_checkpoint`; DistilBERT takes every other layer);
    - `initial_carry(model_block, batch_size) -> pytree | None`: the zero state a recurrent family
      carries from one batch to the next on contiguous data (Transformer-XL and XLNet memory, ELMo's
      LSTM states; `bertology.train.step`, `bertology.data.lanes`);
    - `seq2seq_training(config, tokenizer, examples, source_length, target_length) -> (batches,
      objective, example)`: the family's own sequence-to-sequence fine-tuning (UniLM's masked
      targets); without it a seq2seq task trains teacher-forced, as an encoder-decoder does.

    How a model decodes is its network's (`bertology.models.decoding`), not a field here:
    generation takes a model, whichever family built it.
    """

    model: Callable[..., nn.Module]
    trunk: Callable[[dict], dict]
    flops_per_token: Callable[[ml_collections.ConfigDict, bool], float]
    extra_keys: tuple[str, ...] = ()
    config: Callable[[ModelConfig], Any] | None = None
    build: Callable[[ModelConfig], nn.Module] | None = None
    layer_index: layout.LayerIndex = layout.stack_layer_index
    task_modes: tuple[str, ...] = TASK_MODES
    task_trunk: Callable[[Any, str], nn.Module] | None = None
    task_inputs: Callable[..., dict] | None = None
    task_input_keys: tuple[str, ...] = ()
    reads_words: bool = False
    init_from: Callable[[dict, dict], dict] | None = None
    from_teacher: Callable[[dict, dict], dict] | None = None
    initial_carry: Callable[[ModelConfig, int], Any] | None = None
    seq2seq_training: Callable[..., tuple[Any, Any, dict]] | None = None

    def __post_init__(self) -> None:
        where = self.model.__module__
        if self.task_inputs is not None and not self.task_input_keys:
            raise TypeError(f"{where}: the Family has a task_inputs hook but no task_input_keys; name the arrays "
                            "the hook adds there, or the trunk never receives them")
        if self.task_input_keys and self.task_inputs is None:
            raise TypeError(f"{where}: the Family names task_input_keys {self.task_input_keys} but has no "
                            "task_inputs hook to add them; give the hook or drop the keys")

    def trunk_config(self, model_config: ModelConfig) -> Any:
        """The trunk's config of a `model` block (a TransformerConfig for most families)."""
        if self.config is not None:
            return self.config(model_config)
        return transformer_config(model_config, self.extra_keys)

    def make(self, model_config: ModelConfig) -> nn.Module:
        """The family's network for a `model` block."""
        return self.build(model_config) if self.build is not None else self.model(self.trunk_config(model_config))


# The keys of a `model` block that no parameter depends on: how a run computes its network (a GPU
# run of a CPU-trained checkpoint asks for cudnn and bfloat16) and the recipe's dropout rates (a
# fine-tuning run with attention dropout 0, as cuDNN's fused kernel needs). `run_block` says whose
# value a run started from a checkpoint takes.
RUN_KEYS = ("dtype", "attention_backend", "remat", "norm_backward", "dropout_rate", "attention_dropout_rate")


def run_block(config_block: ModelConfig, checkpoint_block: ModelConfig | None = None) -> dict[str, Any]:
    """The `model` block a run builds its network from: the checkpoint's it starts from
    (`checkpoint_block`), else its config's, with each of `RUN_KEYS` that the config sets (not None;
    fine-tuning's configs leave them unset, since they may start from a run of any family). A key
    left unset keeps the checkpoint's value, or without a checkpoint the network's default."""
    mine = dict(config_block)
    source = mine if checkpoint_block is None else dict(checkpoint_block)
    block = {k: v for k, v in source.items() if v is not None or k not in RUN_KEYS}
    return {**block, **{k: mine[k] for k in RUN_KEYS if mine.get(k) is not None}}


def family(name: str) -> Family:
    """The record of family `name` (`bertology.families.<name>.FAMILY`)."""
    try:
        package = importlib.import_module(f"bertology.families.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"bertology.families.{name}":
            raise
        known = sorted(p.name for p in resources.files("bertology.families").iterdir() if p.is_dir()
                       and p.name != "__pycache__")
        raise UserError(f"unknown model family {name!r}; use one of {', '.join(known)} (bertology/families/)") from None
    return package.FAMILY


def block_fields(model_config: ModelConfig, cls: type, name: str, extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """A `model` block's keys but `family` and `extra_keys`, for the trunk config dataclass `cls`;
    a key `cls` has no field for is refused in one line ("unknown <name> key(s) [...]; valid: ...")."""
    fields = {k: v for k, v in dict(model_config).items() if k not in {"family", *extra_keys}}
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise UserError(f"unknown {name} key(s) {unknown}; valid: {sorted(valid)}")
    return fields


def transformer_config(model_config: ModelConfig, extra_keys: tuple[str, ...] = ()) -> TransformerConfig:
    """TransformerConfig from a `model` block: every key but `family` and `extra_keys`."""
    return TransformerConfig(**block_fields(model_config, TransformerConfig, "model config", extra_keys))


def fixed_architecture(model_config: ModelConfig, architecture: dict[str, Any], name: str,
                       why: str) -> TransformerConfig:
    """`transformer_config` of a block whose family fixes `architecture`: each key filled in where
    the block leaves it out, a block that sets one otherwise refused in one line ("model.norm='post':
    <name> has norm='pre' <why>")."""
    block = dict(model_config)
    for key, value in architecture.items():
        if block.get(key) is None:
            block[key] = value
        elif block[key] != value:
            raise UserError(f"model.{key}={block[key]!r}: {name} has {key}={value!r} {why}")
    return transformer_config(block)


def encoder_config(model_config: ModelConfig) -> Any:
    """The trunk's config of a `model` block (a TransformerConfig for every Transformer family)."""
    return family(dict(model_config)["family"]).trunk_config(model_config)


def build(model_config: ModelConfig) -> nn.Module:
    """The `Model` of family `model_config['family']`."""
    return family(dict(model_config)["family"]).make(model_config)


def pretrained_encoder(params: dict, model_config: ModelConfig) -> tuple[Any, dict]:
    """The trunk of a pretraining run, for fine-tuning or features: (its config, its params)."""
    return encoder_config(model_config), family(dict(model_config)["family"]).trunk(params)


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Training FLOPs per input token of a run config (`model.vocab_size` must be set)."""
    return family(config.model.family).flops_per_token(config, nominal)
