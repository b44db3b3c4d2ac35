"""What interop knows about a Hugging Face model type: its record, and the registry of records.

`hf.py` and `hf_config.py` read records and never ask which family they hold. Each family with
an HF counterpart states its records in its own package (`families/<name>/interop.py`, a tuple
`HF_RECORDS`): its architectures per checkpoint, its name tables (`names.py` holds the ones
several families share), the config keys it shares with ours, what it fixes, what it refuses,
and the translations (`hf_config.py` holds the shared ones) that apply to it. `registry` finds
them, so a new model type touches no shared file.

Several model types can share our family (`gpt`: GPT-2 is pre-LN, OpenAI GPT post-LN; `t5`: T5,
whose v1.0 and v1.1 differ only in settings, and mT5, the same network); export takes the first
one, in its module's `HF_RECORDS` order, whose `fixed` settings the run has.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from bertology import families, models
from bertology.errors import UserError
from bertology.interop import names
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer

HFConfig = dict[str, Any]
Block = dict[str, Any]  # our `model` block
BySource = dict[str, HFConfig]  # HF configs by source, the main checkpoint's first


class Translation(Protocol):
    """A setting that is not one key to one key. `from_hf` completes our block from the HF configs
    by source, the main checkpoint's first (`where`: their directories, for errors); `to_hf`
    completes one source's HF config from our block and that source's `cfg` (and the run's
    tokenizer, when it has one)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None: ...

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None: ...


@dataclasses.dataclass(frozen=True)
class HFModel:
    """One HF model type and how it maps onto one of our families.

    - `architectures`: the HF class export writes, per checkpoint ("source") a run splits into;
      the first source is the one `--in` names, the others are optional extra directories.
    - `layout`: the name tables (`names.Part`s).
    - `prefix`: the trunk's state-dict prefix; a bare trunk (`BertModel`, `GPT2Model`) saves its
      names without it.
    - `keys`: (our model key, HF key) pairs holding the same number.
    - `activation`: the HF key naming it and HF name -> our `model.activation`; export writes the
      first name for ours. A key of None: the type has one activation, `{None: ours}` (Transformer-XL).
    - `fixed`: `model` entries this type implies: an import writes them, an export requires them
      (anything else computes differently). `imported`: entries an import writes that do not
      change what the model computes (initialisation, an unused pooler).
    - `required`: HF config values we reproduce only as given: import refuses any other value,
      export writes them. `written`: other HF entries export writes as they are.
    - `defaults`: transformers' value for every HF key read here, for a config.json that omits it.
    - `translations`: the settings that are not one key to one key.
    - `tied`: HF output layers tied to another tensor: never written; on import they must equal it.
    - `tied_if_absent`: tensors a checkpoint may omit because transformers ties them to another and
      saves only that one (transformers 5: a T5 v1.1 or mT5 it built itself, without `lm_head`; its
      OpenAI GPT double-heads model, without the token table): on import, a copy of the other.
    - `copies`: tensors that other transformers versions read under a second name: export also
      writes each as a copy of its source; import ignores it, reading the source (the Reformer's
      head bias, `lm_head.bias` in 4.x and `lm_head.decoder.bias` in 5.24).
    - `pooler`: the HF name of the pooler's weight, whose presence decides `model.pooler`.
    - `tokenizer`: the HF tokenizer class of a checkpoint without a tokenizer_config.json naming one.
    - `source_configs`: how to get the config of a source other than the trunk's (ELECTRA's generator).
    - `generates`: its architecture generates text (transformers' `can_generate`), so an export
      writes a generation_config.json.
    """

    model_type: str
    family: str
    architectures: Mapping[str, str]
    layout: tuple[names.Part, ...]
    prefix: str
    keys: tuple[tuple[str, str], ...]
    activation: tuple[str | None, Mapping[str | None, str]]
    fixed: Mapping[str, Any]
    defaults: Mapping[str, Any]
    tokenizer: str
    imported: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    required: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    written: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    translations: tuple[Translation, ...] = ()
    tied: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tied_if_absent: Mapping[str, str] = dataclasses.field(default_factory=dict)
    copies: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pooler: str | None = None
    source_configs: Mapping[str, Callable[[dict[str, Any]], TransformerConfig]] = dataclasses.field(
        default_factory=dict)
    generates: bool = False

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(self.architectures)

    def configs(self, block: dict[str, Any]) -> dict[str, TransformerConfig]:
        """The network config of each source of a run with model block `block`."""
        return {source: self.source_configs.get(source, models.encoder_config)(block) for source in self.sources}

    def mismatch(self, cfg: TransformerConfig) -> str | None:
        """The first `fixed` setting `cfg` does not have, as `key=want (not got)`; None if it has all."""
        for key, want in self.fixed.items():
            if getattr(cfg, key) != want:
                return f"model.{key}={want!r} (not {getattr(cfg, key)!r})"
        return None


# Settings several families' records share.

# HF hidden_act -> our model.activation (the erf GELU, or its tanh approximation)
GELUS: dict[str | None, str] = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

ENCODER_KEYS = (  # (our model.<key>, HF config key) for the BERT-style configs
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("type_vocab_size", "type_vocab_size"),
    ("dropout_rate", "hidden_dropout_prob"),
    ("attention_dropout_rate", "attention_probs_dropout_prob"),
    ("layer_norm_eps", "layer_norm_eps"),
    ("initializer_range", "initializer_range"),
)

# What every HF model here computes, and what our core could compute differently.
CORE = dict(norm_kind="layernorm", use_bias=True, positions="absolute", adapter_size=None, scan_layers=False,
            share_layers="none", embedding_size=None, position_offset=0, head_size=None, scale_attention=True,
            scale_embeddings=False, activation_dropout_rate=0.0)
ENCODER = {**CORE, "norm": "post", "embedding_norm": True}
# Transformer-XL and XLNet: relative attention, no absolute positions
RELATIVE = {**{k: v for k, v in CORE.items() if k not in ("positions", "scale_embeddings", "activation_dropout_rate")},
            "positions": "none", "norm": "post", "type_vocab_size": 0, "embedding_norm": False}

BERT_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12,
                     initializer_range=0.02, hidden_act="gelu", position_embedding_type="absolute")
ABSOLUTE = {"position_embedding_type": "absolute"}


def bert_style(model_type: str, architecture: str,
               heads: tuple[names.Row, ...]) -> tuple[dict[str, str], tuple[names.Part, ...]]:
    """(architectures, layout) of a BERT-style single checkpoint: BERT's trunk under `<model_type>.`,
    then the heads."""
    tables = (names.EMBEDDINGS, names.BERT_LAYER, names.BERT_POOLER)
    return ({"model": architecture},
            (names.Part("model", "encoder", model_type, tables, trunk=True),
             names.Part("model", "", "", (heads,), trunk=False)))


@functools.cache
def registry() -> Mapping[str, HFModel]:
    """Every record by model type: each family package's `interop.HF_RECORDS`, in package order
    and, within a package, in its own order (which `for_run` keeps)."""
    found = {r.model_type: r for module in families.contributions("interop") for r in module.HF_RECORDS}
    return types.MappingProxyType(found)


def by_type(model_type: Any, where: str) -> HFModel:
    """The record of an HF config's model_type (`where` names the config in errors)."""
    records = registry()
    if model_type not in records:
        raise UserError(f"{where}: model_type {model_type!r} is not importable; supported: {', '.join(records)}")
    return records[model_type]


def for_run(block: dict[str, Any]) -> HFModel:
    """The record an export of a run with model block `block` writes: the model type of its
    family whose fixed settings it has."""
    family = block["family"]
    candidates = [r for r in registry().values() if r.family == family]
    if not candidates:
        families = sorted({r.family for r in registry().values()})
        raise UserError(f"model family {family!r} has no Hugging Face counterpart; use one of {', '.join(families)}")
    cfg = models.encoder_config(block)
    mismatches = {r.model_type: r.mismatch(cfg) for r in candidates}
    for record in candidates:
        if mismatches[record.model_type] is None:
            return record
    needs = "; ".join(f"{t} needs {m}" for t, m in mismatches.items())
    raise UserError(f"no Hugging Face model type computes this {family} model: {needs}")


def with_extra_source(source: str) -> list[str]:
    """The model types whose runs have a checkpoint `source` besides the main one."""
    return [r.model_type for r in registry().values() if source in r.sources[1:]]
