"""BART's Hugging Face record (`BartForConditionalGeneration`): post-LN stacks sharing one
token table, learned positions counted from 2.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.errors import UserError
from bertology.interop import hf_config, names
from bertology.interop.records import CORE, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


BART_EMBEDDINGS = (  # each stack's own position table and norm; the token table is `shared`
    ("embeddings/position", "embed_positions", "embedding"),
    ("embeddings/norm", "layernorm_embedding", "norm"),
)
BART_LAYER = (
    ("attention_{i}/query", "layers.{i}.self_attn.q_proj", "to_heads"),
    ("attention_{i}/key", "layers.{i}.self_attn.k_proj", "to_heads"),
    ("attention_{i}/value", "layers.{i}.self_attn.v_proj", "to_heads"),
    ("attention_{i}/output", "layers.{i}.self_attn.out_proj", "from_heads"),
    ("attention_{i}/norm", "layers.{i}.self_attn_layer_norm", "norm"),
    ("ffn_{i}/intermediate", "layers.{i}.fc1", "dense"),
    ("ffn_{i}/output", "layers.{i}.fc2", "dense"),
    ("ffn_{i}/norm", "layers.{i}.final_layer_norm", "norm"),
)
BART_CROSS_ATTENTION = (
    ("cross_attention_{i}/query", "layers.{i}.encoder_attn.q_proj", "to_heads"),
    ("cross_attention_{i}/key", "layers.{i}.encoder_attn.k_proj", "to_heads"),
    ("cross_attention_{i}/value", "layers.{i}.encoder_attn.v_proj", "to_heads"),
    ("cross_attention_{i}/output", "layers.{i}.encoder_attn.out_proj", "from_heads"),
    ("cross_attention_{i}/norm", "layers.{i}.encoder_attn_layer_norm", "norm"),
)
BART_HEAD = (("final_logits_bias", "final_logits_bias", "row"),)


@dataclasses.dataclass(frozen=True)
class PositionTableOffset:
    """BART's `max_position_embeddings` counts positions; its table has 2 more rows in front
    (fairseq's offset), so ours is the table's size with `position_offset=2`."""

    offset: int = 2

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["max_position_embeddings"] = hf_config._main(hf)["max_position_embeddings"] + self.offset
        block["position_offset"] = self.offset

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if cfg.position_offset != self.offset:
            raise UserError(f"{hf['model_type']} counts positions from {self.offset}; model.position_offset="
                            f"{cfg.position_offset} has no {hf['model_type']} counterpart")
        hf["max_position_embeddings"] = cfg.max_position_embeddings - self.offset


BART = HFModel(
    "bart", "bart", {"model": "BartForConditionalGeneration"}, prefix="model",
    layout=(names.Part("model", "encoder", "model", (names.SHARED_TOKENS,), trunk=True),
            names.Part("model", "encoder", "model.encoder", (BART_EMBEDDINGS, BART_LAYER), trunk=True),
            names.Part("model", "decoder", "model.decoder",
                       (BART_EMBEDDINGS, BART_LAYER, BART_CROSS_ATTENTION), trunk=True),
            names.Part("model", "", "", (BART_HEAD,), trunk=False)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "d_model"), ("num_layers", "encoder_layers"),
          ("num_heads", "encoder_attention_heads"), ("intermediate_size", "encoder_ffn_dim"),
          ("dropout_rate", "dropout"), ("attention_dropout_rate", "attention_dropout"),
          ("activation_dropout_rate", "activation_dropout"), ("initializer_range", "init_std"),
          ("scale_embeddings", "scale_embedding")),
    activation=("activation_function", {**GELUS, "relu": "relu"}),
    fixed={**{k: v for k, v in CORE.items() if k not in ("position_offset", "scale_embeddings",
                                                         "activation_dropout_rate")},
           "norm": "post", "embedding_norm": True, "type_vocab_size": 0, "layer_norm_eps": 1e-5},
    imported={"pooler": False},
    defaults=dict(vocab_size=50265, max_position_embeddings=1024, d_model=1024, encoder_layers=12,
                  decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                  decoder_ffn_dim=4096, encoder_layerdrop=0.0, decoder_layerdrop=0.0, activation_function="gelu",
                  dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, init_std=0.02, scale_embedding=False,
                  tie_word_embeddings=True),
    tokenizer="BartTokenizer",
    required={"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "tie_word_embeddings": True},
    written={"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
             "forced_eos_token_id": 2, "is_encoder_decoder": True},
    translations=(PositionTableOffset(),
                  hf_config.DecoderDepth("decoder_layers"),
                  hf_config.SameValue("decoder_attention_heads", "encoder_attention_heads", "num_heads"),
                  hf_config.SameValue("decoder_ffn_dim", "encoder_ffn_dim", "intermediate_size")),
    tied={"model.encoder.embed_tokens.weight": "model.shared.weight",
          "model.decoder.embed_tokens.weight": "model.shared.weight", "lm_head.weight": "model.shared.weight"},
    generates=True,
)

HF_RECORDS = (BART,)
