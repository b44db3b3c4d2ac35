"""Hugging Face `config.json` <-> our `model` config block, driven by a model type's record.

Only settings our Transformer reproduces exactly are accepted: a checkpoint whose math we would
silently change (another activation, relative positions, ALBERT layer groups, GPT-2's per-layer
attention scaling, an untied output layer) fails with one line instead of importing into a model
that computes something else. Export refuses a model that no HF model type computes.

Most settings are one HF key for one of ours (`HFModel.keys`), a fixed value on either side
(`fixed`, `required`) or the activation's name; the few that are not are `Translation`s below,
and a record lists the ones that apply to it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from bertology.errors import UserError
from bertology.families.electra.model import generator_config
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer
    from bertology.interop.families import HFModel

HFConfig = dict[str, Any]
Block = dict[str, Any]  # our `model` block
BySource = dict[str, HFConfig]  # HF configs by source, the main checkpoint's first


def _main(by_source: dict[str, Any]) -> Any:
    """The main checkpoint's (`--in`) entry of a dict by source."""
    return next(iter(by_source.values()))


class Translation(Protocol):
    """A setting that is not one key to one key. `from_hf` completes our block from the HF configs
    by source, the main checkpoint's first (`where`: their directories, for errors); `to_hf`
    completes one source's HF config from our block and that source's `cfg` (and the run's
    tokenizer, when it has one)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None: ...

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None: ...


@dataclasses.dataclass(frozen=True)
class PaddingOffset:
    """RoBERTa counts positions from padding_idx + 1, so its first position id is pad_token_id + 1."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["position_offset"] = _main(hf)["pad_token_id"] + 1

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if cfg.position_offset < 1:
            raise UserError(f"{hf['model_type']} export needs model.position_offset >= 1 (its first position id "
                            f"is pad_token_id + 1), not {cfg.position_offset}")
        hf.update(pad_token_id=cfg.position_offset - 1, bos_token_id=0, eos_token_id=2)


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
class FeedForwardWidth:
    """GPT-2's `n_inner` (None: 4·hidden); OpenAI GPT has no key (`key=None`) and always 4·hidden."""

    key: str | None

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        inner = _main(hf)[self.key] if self.key else None
        block["intermediate_size"] = inner or 4 * block["hidden_size"]

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if self.key:
            hf[self.key] = cfg.intermediate_size
        elif cfg.intermediate_size != 4 * cfg.hidden_size:
            raise UserError(f"{hf['model_type']}'s feed-forward width is 4·hidden = {4 * cfg.hidden_size}; "
                            f"model.intermediate_size={cfg.intermediate_size} has no {hf['model_type']} counterpart")


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
class HeadSize:
    """T5's `d_kv`, the width of one head, which need not be d_model / num_heads (mT5-small: 512, 6, 64)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["head_size"] = _main(hf)["d_kv"]

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf["d_kv"] = cfg.head_dim


@dataclasses.dataclass(frozen=True)
class FeedForwardProj:
    """T5 derives its activation (`dense_act_fn`) from `feed_forward_proj` ('gated-gelu' means the
    tanh GELU); a config that overrides it with anything else computes something we do not."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        proj = _main(hf)["feed_forward_proj"]
        derived = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
        got = _main(hf).get("dense_act_fn", derived)
        if got != derived:
            raise UserError(f"{_main(where)}: dense_act_fn={got!r} with feed_forward_proj={proj!r} is not reproduced "
                            f"(we compute {derived!r}); the checkpoint cannot be imported without changing its outputs")

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class TiedOutput:
    """T5 v1.0 ties its output layer to the token table (and scales the decoder states by
    d_model**-0.5); v1.1 and mT5 have an untied `lm_head`: our `model.tie_embeddings`."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["tie_embeddings"] = bool(_main(hf)["tie_word_embeddings"])

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf["tie_word_embeddings"] = bool(block.get("tie_embeddings", True))


@dataclasses.dataclass(frozen=True)
class PositionTableOffset:
    """BART's `max_position_embeddings` counts positions; its table has 2 more rows in front
    (fairseq's offset), so ours is the table's size with `position_offset=2`."""

    offset: int = 2

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["max_position_embeddings"] = _main(hf)["max_position_embeddings"] + self.offset
        block["position_offset"] = self.offset

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if cfg.position_offset != self.offset:
            raise UserError(f"{hf['model_type']} counts positions from {self.offset}; model.position_offset="
                            f"{cfg.position_offset} has no {hf['model_type']} counterpart")
        hf["max_position_embeddings"] = cfg.max_position_embeddings - self.offset


@dataclasses.dataclass(frozen=True)
class EndOfText:
    """GPT-2 begins and ends texts with its `<|endoftext|>`: export names the run tokenizer's id, so
    HF generation stops where ours does (null without a tokenizer: no id to name)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        pass

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        eos = tokenizer.eos_id if tokenizer is not None else None
        hf.update(bos_token_id=eos, eos_token_id=eos)


@dataclasses.dataclass(frozen=True)
class ElectraGenerator:
    """ELECTRA's generator is a second checkpoint whose width is a fraction of the discriminator's;
    only the replaced-token discriminator head has an HF counterpart."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        if "generator" in hf:
            block["generator_fraction"] = _generator_fraction(block, hf["generator"], where["generator"])

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if block.get("discriminator_head", "rtd") != "rtd":
            raise UserError("only ELECTRA's replaced-token discriminator head has a Hugging Face counterpart")


def _generator_fraction(block: Block, gen: HFConfig, where: str) -> float:
    """The generator_fraction whose generator has exactly the HF generator's shape."""
    disc = TransformerConfig(**{k: v for k, v in block.items() if k != "family"})
    fraction = gen["hidden_size"] / disc.hidden_size
    ours = generator_config(disc, fraction)
    expected = {"hidden_size": ours.hidden_size, "num_hidden_layers": ours.num_layers,
                "num_attention_heads": ours.num_heads, "intermediate_size": ours.intermediate_size,
                "vocab_size": ours.vocab_size, "embedding_size": ours.embed_dim,
                "max_position_embeddings": ours.max_position_embeddings}
    for key, value in expected.items():
        if gen[key] != value:
            raise UserError(f"{where}: {key}={gen[key]} but a generator of fraction {fraction:g} of the discriminator "
                            f"has {value}; our ELECTRA generator cannot take this shape")
    return fraction


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
