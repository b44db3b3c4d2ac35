"""Longformer's Hugging Face record (`LongformerForMaskedLM`): RoBERTa's trunk and LM head under
`longformer.`, each layer's self-attention with three more projections (`query_global`,
`key_global`, `value_global`), and `attention_window` (one int for every layer, or a list).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.families.roberta.interop import ROBERTA_HEADS, PaddingOffset
from bertology.interop import hf_config, names
from bertology.interop.records import BERT_DEFAULTS, ENCODER, ENCODER_KEYS, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer

LONGFORMER_GLOBAL = (
    ("attention_{i}/query_global", "encoder.layer.{i}.attention.self.query_global", "to_heads"),
    ("attention_{i}/key_global", "encoder.layer.{i}.attention.self.key_global", "to_heads"),
    ("attention_{i}/value_global", "encoder.layer.{i}.attention.self.value_global", "to_heads"),
)


@dataclasses.dataclass(frozen=True)
class AttentionWindow:
    """HF's `attention_window` (an int, or one per layer) <-> our `model.attention_window` (a list)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        window = hf_config._main(hf).get("attention_window", 512)
        block["attention_window"] = [window] if isinstance(window, int) else list(window)

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        windows = list(getattr(cfg, "attention_window"))
        hf["attention_window"] = windows * cfg.num_layers if len(windows) == 1 else windows


LONGFORMER = HFModel(
    "longformer", "longformer", {"model": "LongformerForMaskedLM"},
    layout=(names.Part("model", "encoder", "longformer",
                       (names.EMBEDDINGS, names.BERT_LAYER, LONGFORMER_GLOBAL, names.BERT_POOLER), trunk=True),
            names.Part("model", "", "", (ROBERTA_HEADS,), trunk=False)),
    prefix="longformer", keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={k: v for k, v in ENCODER.items() if k != "position_offset"},  # PaddingOffset sets it
    # LongformerConfig has no position_embedding_type (its positions are always absolute)
    defaults={**{k: v for k, v in BERT_DEFAULTS.items() if k != "position_embedding_type"}, "pad_token_id": 1,
              "attention_window": 512}, tokenizer="RobertaTokenizer",
    translations=(PaddingOffset(), AttentionWindow()),
    tied={"lm_head.decoder.weight": "longformer.embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    pooler="longformer.pooler.dense.weight",
)

HF_RECORDS = (LONGFORMER,)
