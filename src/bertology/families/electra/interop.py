"""ELECTRA's Hugging Face record: the discriminator (`ElectraForPreTraining`) and, as a second
checkpoint, the generator (`ElectraForMaskedLM`), which shares its embeddings.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertology import models
from bertology.errors import UserError
from bertology.families.electra.model import generator_config
from bertology.interop import hf_config, names
from bertology.interop.records import ABSOLUTE, BERT_DEFAULTS, ENCODER, ENCODER_KEYS, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


ELECTRA_PROJECTION = (("embeddings_projection", "embeddings_project", "dense"),)  # only when E != H

DISCRIMINATOR_HEADS = (
    ("discriminator/dense", "discriminator_predictions.dense", "dense"),
    ("discriminator/prediction", "discriminator_predictions.dense_prediction", "dense"),
)
GENERATOR_HEADS = (
    ("generator/mlm/transform", "generator_predictions.dense", "dense"),
    ("generator/mlm/norm", "generator_predictions.LayerNorm", "norm"),
    ("generator/mlm/bias", "generator_lm_head.bias", "tensor"),
)


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


def _generator(block: dict[str, Any]) -> TransformerConfig:
    return models.build(block).generator_cfg


ELECTRA = HFModel(
    "electra", "electra", {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM"},
    prefix="electra",
    layout=(names.Part("discriminator", "discriminator/encoder", "electra",
                       (names.EMBEDDINGS, ELECTRA_PROJECTION, names.BERT_LAYER), trunk=True),
            names.Part("discriminator", "", "", (DISCRIMINATOR_HEADS,), trunk=False),
            names.Part("generator", "generator/encoder", "electra", (ELECTRA_PROJECTION, names.BERT_LAYER),
                       trunk=True),
            names.Part("generator", "discriminator/encoder", "electra", (names.EMBEDDINGS,), trunk=True,
                       export_only=True),
            names.Part("generator", "", "", (GENERATOR_HEADS,), trunk=False)),
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={**{k: v for k, v in ENCODER.items() if k != "embedding_size"}, "pooler": False},
    defaults={**BERT_DEFAULTS, "embedding_size": 128, "hidden_size": 256, "num_attention_heads": 4,
              "intermediate_size": 1024},
    tokenizer="ElectraTokenizer", required=ABSOLUTE, written={"pad_token_id": 0},
    translations=(hf_config.EmbeddingSize(always_projected=False), ElectraGenerator()),
    tied={"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"},
    source_configs={"generator": _generator},
)

HF_RECORDS = (ELECTRA,)
