"""Hugging Face `config.json` <-> our `model` config block, driven by a model type's record.

Only settings our Transformer reproduces exactly are accepted: a checkpoint whose math we would
silently change (another activation, relative positions, ALBERT layer groups, GPT-2's per-layer
attention scaling, an untied output layer) fails with one line instead of importing into a model
that computes something else. Export refuses a model that no HF model type computes.

Most settings are one HF key for one of ours (`HFModel.keys`), a fixed value on either side
(`fixed`, `required`) or the activation's name; the few that are not are `Translation`s
(`records.Translation`), and a record lists the ones that apply to it. Those several families
use are below; one family's own are in its `interop.py`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertology.errors import UserError
from bertology.interop.records import Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


def _main(by_source: dict[str, Any]) -> Any:
    """The main checkpoint's (`--in`) entry of a dict by source."""
    return next(iter(by_source.values()))


@dataclasses.dataclass(frozen=True)
class EmbeddingSize:
    """ALBERT and ELECTRA factorize the embeddings into E dimensions. ALBERT always projects E to
    H; ELECTRA only when E != H (`always_projected`), which we express as `embedding_size=None`."""

    always_projected: bool

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        size = _main(hf)["embedding_size"]
        block["embedding_size"] = size if self.always_projected or size != block["hidden_size"] else None

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if self.always_projected and cfg.embedding_size is None:
            raise UserError(f"{hf['model_type']} export needs model.embedding_size set (its embeddings are "
                            "always projected)")
        hf["embedding_size"] = cfg.embed_dim


@dataclasses.dataclass(frozen=True)
class SameValue:
    """Two HF keys that our one setting `ours` covers (GPT's embedding and residual dropout; BART's
    encoder and decoder heads and width): HF's `key` must equal `same_as` (a missing or null `key`
    means "same as")."""

    key: str
    same_as: str
    ours: str

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        got, want = _main(hf).get(self.key), _main(hf)[self.same_as]
        if got is not None and got != want:
            raise UserError(f"{_main(where)}: {self.key}={got} differs from {self.same_as}={want}; we have one "
                            f"model.{self.ours} for both (edit config.json to make them equal)")

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf[self.key] = getattr(cfg, self.ours)


@dataclasses.dataclass(frozen=True)
class DecoderDepth:
    """An encoder-decoder's decoder depth (T5's `num_decoder_layers`, null or missing: as many as
    `num_layers`; BART's `decoder_layers`): our `model.num_decoder_layers`, imported only where it
    differs from the encoder's, so a checkpoint of equal depths imports as before; export always
    writes it (`num_layers` when unset)."""

    key: str

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        depth = _main(hf).get(self.key)
        if depth is not None and depth != block["num_layers"]:
            block["num_decoder_layers"] = depth

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf[self.key] = cfg.decoder_layers


@dataclasses.dataclass(frozen=True)
class OneDropout:
    """T5 applies its one `dropout_rate` to the attention probabilities and to the feed-forward
    hidden layer too (`T5DenseActDense`: wi → activation → dropout → wo)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["attention_dropout_rate"] = block["activation_dropout_rate"] = block["dropout_rate"]

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        for key in ("attention_dropout_rate", "activation_dropout_rate"):
            if getattr(cfg, key) != cfg.dropout_rate:
                raise UserError(f"{hf['model_type']} has one dropout rate; model.{key}="
                                f"{getattr(cfg, key)} must equal model.dropout_rate={cfg.dropout_rate}")


@dataclasses.dataclass(frozen=True)
class Recurrent:
    """Transformer-XL's and XLNet's settings beyond the Transformer's: the memory and relative
    attention keys (`keys`: (our model key, HF key, our default); HF's null means our default),
    the head width `d_head`, and the feed-forward dropout, which HF applies at the rate of the
    residual dropout. HF XLNet always has per-layer relative biases, so `untied` refuses to
    export a run that shares them (`model.untie_r=False`)."""

    keys: tuple[tuple[str, str, Any], ...]
    untied: bool = False

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        main = _main(hf)
        block.update({ours: default if main.get(key) is None else main[key] for ours, key, default in self.keys})
        block["head_size"] = None if main["d_head"] * block["num_heads"] == block["hidden_size"] else main["d_head"]
        block["activation_dropout_rate"] = block["dropout_rate"]

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if self.untied and not block.get("untie_r", True):
            raise UserError(f"{hf['model_type']} has relative biases per layer; export needs model.untie_r=True")
        hf.update({key: block.get(ours, default) for ours, key, default in self.keys}, d_head=cfg.head_dim)


def _check_reproducible(record: HFModel, hf: HFConfig, where: str) -> None:
    key, names = record.activation
    if key is not None and hf[key] not in names:
        raise UserError(f"{where}: {key}={hf[key]!r} is not reproduced (we have {', '.join(names)}); "
                        "the checkpoint cannot be imported without changing its outputs")
    for key, value in record.required.items():
        if hf[key] != value:
            raise UserError(f"{where}: {key}={hf[key]!r} is not reproduced (we compute {key}={value!r}); "
                            "the checkpoint cannot be imported without changing its outputs")


def from_hf(record: HFModel, configs: BySource, where: dict[str, str]) -> Block:
    """Our `model` block for the HF configs of a model type (by source; the first is the main one)."""
    hf = {source: {**record.defaults, **config} for source, config in configs.items()}
    first = record.sources[0]
    others = {arch: source for source, arch in record.architectures.items() if source != first}
    for arch in hf[first].get("architectures") or ():
        if arch in others:
            raise UserError(f"{where[first]} is a {record.model_type} {others[arch]} ({arch}); pass the {first} as "
                            f"--in and this one as --{others[arch]}")
    for source, config in hf.items():
        _check_reproducible(record, config, where[source])
    block: Block = {"family": record.family}
    block.update({ours: hf[first][key] for ours, key in record.keys})
    key, names = record.activation
    block["activation"] = names[None if key is None else hf[first][key]]
    block.update(record.fixed)
    block.update(record.imported)
    for translation in record.translations:
        translation.from_hf(hf, block, where)
    return block


def activation_name(record: HFModel, activation: str) -> str:
    """The HF name of our activation for this model type (the first in its table)."""
    key, names = record.activation
    for name, ours in names.items():
        if ours == activation:
            return name
    raise UserError(f"{record.model_type} has no {key or 'activation'} computing model.activation={activation!r}; "
                    f"it has {', '.join(sorted(set(names.values())))}")


def to_hf(record: HFModel, block: Block, source: str, cfg: TransformerConfig,
          tokenizer: Tokenizer | None) -> HFConfig:
    """The HF config.json of `source` ("model", or ELECTRA's "discriminator"/"generator") whose
    network has config `cfg`."""
    hf: HFConfig = {
        "model_type": record.model_type,
        "architectures": [record.architectures[source]],
        **record.required,
        **record.written,
        **{key: getattr(cfg, ours) for ours, key in record.keys},
    }
    name = activation_name(record, cfg.activation)
    if record.activation[0] is not None:
        hf[record.activation[0]] = name
    for translation in record.translations:
        translation.to_hf(block, cfg, hf, tokenizer)
    return hf
