"""BERT's Hugging Face record (`BertForPreTraining`): the BERT-style tables and settings
`interop.records` and `interop.names` share.
"""

from __future__ import annotations

from bertology.interop import names
from bertology.interop.records import ABSOLUTE, BERT_DEFAULTS, ENCODER, ENCODER_KEYS, GELUS, HFModel, bert_style

BERT = HFModel(
    "bert", "bert", *bert_style("bert", "BertForPreTraining", names.BERT_HEADS), prefix="bert",
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS), fixed=ENCODER, defaults=BERT_DEFAULTS,
    tokenizer="BertTokenizer", required=ABSOLUTE, written={"pad_token_id": 0},
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="bert.pooler.dense.weight",
)

HF_RECORDS = (BERT,)
