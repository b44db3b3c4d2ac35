"""DistilBERT's Hugging Face record (`DistilBertForMaskedLM`): BERT's embeddings without a
segment table, its own layer and head names.
"""

from __future__ import annotations

from bertology.interop import names
from bertology.interop.records import ENCODER, GELUS, HFModel

DISTILBERT_LAYER = (  # the trunk's embeddings are BERT's (`EMBEDDINGS`), without a segment table
    ("attention_{i}/query", "transformer.layer.{i}.attention.q_lin", "to_heads"),
    ("attention_{i}/key", "transformer.layer.{i}.attention.k_lin", "to_heads"),
    ("attention_{i}/value", "transformer.layer.{i}.attention.v_lin", "to_heads"),
    ("attention_{i}/output", "transformer.layer.{i}.attention.out_lin", "from_heads"),
    ("attention_{i}/norm", "transformer.layer.{i}.sa_layer_norm", "norm"),
    ("ffn_{i}/intermediate", "transformer.layer.{i}.ffn.lin1", "dense"),
    ("ffn_{i}/output", "transformer.layer.{i}.ffn.lin2", "dense"),
    ("ffn_{i}/norm", "transformer.layer.{i}.output_layer_norm", "norm"),
)

DISTILBERT_HEADS = (
    ("mlm/transform", "vocab_transform", "dense"),
    ("mlm/norm", "vocab_layer_norm", "norm"),
    ("mlm/bias", "vocab_projector.bias", "tensor"),
)

DISTILBERT = HFModel(
    "distilbert", "distilbert", {"model": "DistilBertForMaskedLM"}, prefix="distilbert",
    layout=(names.Part("model", "encoder", "distilbert", (names.EMBEDDINGS, DISTILBERT_LAYER), trunk=True),
            names.Part("model", "", "", (DISTILBERT_HEADS,), trunk=False)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "dim"), ("num_layers", "n_layers"), ("num_heads", "n_heads"),
          ("intermediate_size", "hidden_dim"), ("max_position_embeddings", "max_position_embeddings"),
          ("dropout_rate", "dropout"), ("attention_dropout_rate", "attention_dropout"),
          ("initializer_range", "initializer_range")),
    activation=("activation", {**GELUS, "relu": "relu"}),
    # every LayerNorm of DistilBERT has eps 1e-12, not a config key
    fixed={**ENCODER, "type_vocab_size": 0, "pooler": False, "layer_norm_eps": 1e-12},
    defaults=dict(vocab_size=30522, max_position_embeddings=512, sinusoidal_pos_embds=False, n_layers=6, n_heads=12,
                  dim=768, hidden_dim=3072, dropout=0.1, attention_dropout=0.1, activation="gelu",
                  initializer_range=0.02, tie_word_embeddings=True),
    tokenizer="DistilBertTokenizer", required={"sinusoidal_pos_embds": False, "tie_word_embeddings": True},
    written={"pad_token_id": 0},
    tied={"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"},
)

HF_RECORDS = (DISTILBERT,)
