"""Megatron-BERT's Hugging Face record (`MegatronBertForPreTraining`): BERT's config keys,
names and heads, with pre-LN layers, a final norm and no embedding norm
(`families.megatron_bert.model`); HF's defaults are megatron-bert-cased-345m's shape.
"""

from __future__ import annotations

from bertology.interop import names
from bertology.interop.records import ABSOLUTE, BERT_DEFAULTS, CORE, ENCODER_KEYS, GELUS, HFModel

# Pre-LN, so a layer's norms are its sublayers'
# inputs' (`attention.ln` before self-attention, the layer's own `ln` before the feed-forward
# block) and the stack ends in `encoder.ln`. Its embeddings are BERT's without a LayerNorm (the
# `EMBEDDINGS` norm row finds no tensor of ours), its pooler and heads BERT's.
MEGATRON_BERT_LAYER = (
    ("attention_{i}/norm", "encoder.layer.{i}.attention.ln", "norm"),
    ("attention_{i}/query", "encoder.layer.{i}.attention.self.query", "to_heads"),
    ("attention_{i}/key", "encoder.layer.{i}.attention.self.key", "to_heads"),
    ("attention_{i}/value", "encoder.layer.{i}.attention.self.value", "to_heads"),
    ("attention_{i}/output", "encoder.layer.{i}.attention.output.dense", "from_heads"),
    ("ffn_{i}/norm", "encoder.layer.{i}.ln", "norm"),
    ("ffn_{i}/intermediate", "encoder.layer.{i}.intermediate.dense", "dense"),
    ("ffn_{i}/output", "encoder.layer.{i}.output.dense", "dense"),
)
MEGATRON_BERT_FINAL_NORM = (("final_norm", "encoder.ln", "norm"),)

MEGATRON_BERT = HFModel(
    "megatron-bert", "megatron_bert", {"model": "MegatronBertForPreTraining"}, prefix="bert",
    layout=(names.Part("model", "encoder", "bert", (names.EMBEDDINGS, MEGATRON_BERT_LAYER,
                                                    MEGATRON_BERT_FINAL_NORM, names.BERT_POOLER), trunk=True),
            names.Part("model", "", "", (names.BERT_HEADS,), trunk=False)),
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS), fixed={**CORE, "norm": "pre", "embedding_norm": False},
    defaults={**BERT_DEFAULTS, "vocab_size": 29056, "hidden_size": 1024, "num_hidden_layers": 24,
              "num_attention_heads": 16, "intermediate_size": 4096},
    tokenizer="BertTokenizer", required=ABSOLUTE, written={"pad_token_id": 0},
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="bert.pooler.dense.weight",
)

HF_RECORDS = (MEGATRON_BERT,)
