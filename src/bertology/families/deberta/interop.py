"""DeBERTa-v3's Hugging Face record (`DebertaV2ForMaskedLM`, transformers' `models/deberta_v2`).

HF's v2 config covers DeBERTa v2 and v3; this record reproduces the v3 setting only
(`relative_attention=True`, `pos_att_type=["p2c", "c2p"]`, `position_biased_input=False`,
`share_att_key=True`, `norm_rel_ebd="layer_norm"`, no convolution, no segments) and refuses any
other. The MLM head is HF's default `legacy=True` layout (`cls.predictions.transform.*`, the
decoder tied to the word embeddings, `cls.predictions.bias`). transformers 4.57's `legacy=False`
head (`lm_predictions.lm_head.*`, the names in microsoft's released checkpoints) does not
round-trip there: its `_tied_weights_keys` names the word embeddings, so `save_pretrained` drops
them, and `get_output_embeddings` returns the head's transform. Both compute dense, GELU,
LayerNorm, the tied table and a bias; an import of an `lm_predictions` head keeps a fresh one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertology.interop import names
from bertology.interop.records import CORE, ENCODER_KEYS, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


class PadToken:
    """HF's word embedding takes `pad_token_id` as its padding index (it changes no output):
    export names the run tokenizer's, or 0; import reads none."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        pass

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf["pad_token_id"] = 0 if tokenizer is None else tokenizer.pad_id


DEBERTA_EMBEDDINGS = (
    ("embeddings/token", "embeddings.word_embeddings", "embedding"),
    ("embeddings/norm", "embeddings.LayerNorm", "norm"),
)
DEBERTA_LAYER = (
    ("attention_{i}/query", "encoder.layer.{i}.attention.self.query_proj", "to_heads"),
    ("attention_{i}/key", "encoder.layer.{i}.attention.self.key_proj", "to_heads"),
    ("attention_{i}/value", "encoder.layer.{i}.attention.self.value_proj", "to_heads"),
    ("attention_{i}/output", "encoder.layer.{i}.attention.output.dense", "from_heads"),
    ("attention_{i}/norm", "encoder.layer.{i}.attention.output.LayerNorm", "norm"),
    ("ffn_{i}/intermediate", "encoder.layer.{i}.intermediate.dense", "dense"),
    ("ffn_{i}/output", "encoder.layer.{i}.output.dense", "dense"),
    ("ffn_{i}/norm", "encoder.layer.{i}.output.LayerNorm", "norm"),
)
DEBERTA_RELATIVE = (  # the layer-shared relative table and its LayerNorm
    ("relative_embeddings", "encoder.rel_embeddings", "embedding"),
    ("relative_norm", "encoder.LayerNorm", "norm"),
)
DEBERTA_HEADS = (  # relative to the model root (HF's legacy head, as BERT's)
    ("mlm/transform", "cls.predictions.transform.dense", "dense"),
    ("mlm/norm", "cls.predictions.transform.LayerNorm", "norm"),
    ("mlm/bias", "cls.predictions.bias", "tensor"),
)

DEBERTA_KEYS = (*(k for k in ENCODER_KEYS if k[0] != "type_vocab_size"),
                ("position_buckets", "position_buckets"), ("max_relative_positions", "max_relative_positions"))

# transformers 4.57.6's DebertaV2Config() for every key read here (the last four are read with
# getattr defaults by the modeling code, absent from the config's signature)
DEBERTA_DEFAULTS = dict(
    vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24, intermediate_size=6144,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=0, initializer_range=0.02, layer_norm_eps=1e-7, relative_attention=False,
    max_relative_positions=-1, position_biased_input=True, pos_att_type=None,
    position_buckets=-1, share_att_key=False, norm_rel_ebd="none", conv_kernel_size=0,
)

DEBERTA_V2 = HFModel(
    "deberta-v2", "deberta", {"model": "DebertaV2ForMaskedLM"},
    layout=(names.Part("model", "encoder", "deberta", (DEBERTA_EMBEDDINGS, DEBERTA_LAYER, DEBERTA_RELATIVE),
                       trunk=True),
            names.Part("model", "", "", (DEBERTA_HEADS,), trunk=False)),
    prefix="deberta", keys=DEBERTA_KEYS,
    activation=("hidden_act", GELUS),
    fixed={**{k: v for k, v in CORE.items() if k != "positions"}, "norm": "post", "embedding_norm": True,
           "positions": "none", "type_vocab_size": 0, "pooler": False},
    defaults=DEBERTA_DEFAULTS, tokenizer="PreTrainedTokenizerFast",
    required=dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                  share_att_key=True, norm_rel_ebd="layer_norm", conv_kernel_size=0, type_vocab_size=0),
    written={"legacy": True},
    translations=(PadToken(),),
    tied={"cls.predictions.decoder.weight": "deberta.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
)

HF_RECORDS = (DEBERTA_V2,)
