"""ALBERT's Hugging Face record (`AlbertForPreTraining`): one shared layer, the factorized
embeddings and the sentence-order head.
"""

from __future__ import annotations

from bertology.interop import hf_config, names
from bertology.interop.records import ABSOLUTE, BERT_DEFAULTS, ENCODER, ENCODER_KEYS, GELUS, HFModel

_ALBERT = "encoder.albert_layer_groups.0.albert_layers.0"
ALBERT_LAYER = (  # one shared layer, applied num_layers times
    ("attention_0/query", f"{_ALBERT}.attention.query", "to_heads"),
    ("attention_0/key", f"{_ALBERT}.attention.key", "to_heads"),
    ("attention_0/value", f"{_ALBERT}.attention.value", "to_heads"),
    ("attention_0/output", f"{_ALBERT}.attention.dense", "from_heads"),
    ("attention_0/norm", f"{_ALBERT}.attention.LayerNorm", "norm"),
    ("ffn_0/intermediate", f"{_ALBERT}.ffn", "dense"),
    ("ffn_0/output", f"{_ALBERT}.ffn_output", "dense"),
    ("ffn_0/norm", f"{_ALBERT}.full_layer_layer_norm", "norm"),
)
ALBERT_PROJECTION = (("embeddings_projection", "encoder.embedding_hidden_mapping_in", "dense"),)
ALBERT_POOLER = (("pooler", "pooler", "dense"),)

ALBERT_HEADS = (
    ("mlm/transform", "predictions.dense", "dense"),
    ("mlm/norm", "predictions.LayerNorm", "norm"),
    ("mlm/bias", "predictions.bias", "tensor"),
    ("sop/dense", "sop_classifier.classifier", "dense"),
)

ALBERT = HFModel(
    "albert", "albert", {"model": "AlbertForPreTraining"}, prefix="albert",
    layout=(names.Part("model", "encoder", "albert", (names.EMBEDDINGS, ALBERT_PROJECTION, ALBERT_LAYER,
                                                      ALBERT_POOLER), trunk=True),
            names.Part("model", "", "", (ALBERT_HEADS,), trunk=False)),
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={**{k: v for k, v in ENCODER.items() if k != "embedding_size"}, "share_layers": "all"},
    defaults={**BERT_DEFAULTS, "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096,
              "num_attention_heads": 64, "intermediate_size": 16384, "hidden_act": "gelu_new",
              "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0, "num_hidden_groups": 1,
              "inner_group_num": 1},
    tokenizer="AlbertTokenizer", required={**ABSOLUTE, "num_hidden_groups": 1, "inner_group_num": 1},
    written={"pad_token_id": 0}, translations=(hf_config.EmbeddingSize(always_projected=True),),
    tied={"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"},
    pooler="albert.pooler.weight",
)

HF_RECORDS = (ALBERT,)
