"""RoBERTa's Hugging Face record (`RobertaForMaskedLM`): BERT's trunk, its own LM head, and
positions counted from the padding id.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.errors import UserError
from bertology.interop import hf_config
from bertology.interop.records import (
    ABSOLUTE,
    BERT_DEFAULTS,
    ENCODER,
    ENCODER_KEYS,
    GELUS,
    Block,
    BySource,
    HFConfig,
    HFModel,
    bert_style,
)
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


ROBERTA_HEADS = (
    ("mlm/transform", "lm_head.dense", "dense"),
    ("mlm/norm", "lm_head.layer_norm", "norm"),
    ("mlm/bias", "lm_head.bias", "tensor"),
)


@dataclasses.dataclass(frozen=True)
class PaddingOffset:
    """RoBERTa counts positions from padding_idx + 1, so its first position id is pad_token_id + 1."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["position_offset"] = hf_config._main(hf)["pad_token_id"] + 1

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if cfg.position_offset < 1:
            raise UserError(f"{hf['model_type']} export needs model.position_offset >= 1 (its first position id "
                            f"is pad_token_id + 1), not {cfg.position_offset}")
        hf.update(pad_token_id=cfg.position_offset - 1, bos_token_id=0, eos_token_id=2)


ROBERTA = HFModel(
    "roberta", "roberta", *bert_style("roberta", "RobertaForMaskedLM", ROBERTA_HEADS), prefix="roberta",
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={k: v for k, v in ENCODER.items() if k != "position_offset"},  # PaddingOffset sets it
    defaults={**BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1}, tokenizer="RobertaTokenizer",
    required=ABSOLUTE, translations=(PaddingOffset(),),
    tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    pooler="roberta.pooler.dense.weight",
)

HF_RECORDS = (ROBERTA,)
