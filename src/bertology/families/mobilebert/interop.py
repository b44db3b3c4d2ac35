"""MobileBERT's Hugging Face record (`MobileBertForPreTraining`): its bottlenecked layers, the
settings `families.mobilebert.model` adds, and BERT's pooler.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertology.families.mobilebert import model as mobilebert
from bertology.interop import hf_config, names
from bertology.interop.records import BERT_DEFAULTS, ENCODER, ENCODER_KEYS, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

# MobileBERT: `layer_{i}` holds a whole block (bottlenecks, attention, stacked FFNs); HF numbers
# the stacked FFNs `ffn.{j}` (num_feedforward_networks - 1 of them; rows for up to 16, the paper
# stacks 4 in all), and its last FFN is the layer's `intermediate` and `output`.
MOBILEBERT_EMBEDDINGS = (
    *names.EMBEDDINGS[:3],
    ("embeddings/transformation", "embeddings.embedding_transformation", "dense"),
    ("embeddings/norm", "embeddings.LayerNorm", "norm"),
)
_MB = "encoder.layer.{i}"
MOBILEBERT_LAYER = (
    ("layer_{i}/bottleneck", f"{_MB}.bottleneck.input.dense", "dense"),
    ("layer_{i}/bottleneck_norm", f"{_MB}.bottleneck.input.LayerNorm", "norm"),
    ("layer_{i}/shared_bottleneck", f"{_MB}.bottleneck.attention.dense", "dense"),
    ("layer_{i}/shared_bottleneck_norm", f"{_MB}.bottleneck.attention.LayerNorm", "norm"),
    ("layer_{i}/attention/query", f"{_MB}.attention.self.query", "to_heads"),
    ("layer_{i}/attention/key", f"{_MB}.attention.self.key", "to_heads"),
    ("layer_{i}/attention/value", f"{_MB}.attention.self.value", "to_heads"),
    ("layer_{i}/attention/output", f"{_MB}.attention.output.dense", "from_heads"),
    ("layer_{i}/attention/norm", f"{_MB}.attention.output.LayerNorm", "norm"),
    *((f"layer_{{i}}/ffn_{j}/{ours}", f"{_MB}.ffn.{j}.{hf}", kind) for j in range(15)
      for ours, hf, kind in (("intermediate", "intermediate.dense", "dense"), ("output", "output.dense", "dense"),
                             ("norm", "output.LayerNorm", "norm"))),
    ("layer_{i}/ffn_last/intermediate", f"{_MB}.intermediate.dense", "dense"),
    ("layer_{i}/ffn_last/output", f"{_MB}.output.dense", "dense"),
    ("layer_{i}/ffn_last/norm", f"{_MB}.output.LayerNorm", "norm"),
    ("layer_{i}/output_bottleneck", f"{_MB}.output.bottleneck.dense", "dense"),
    ("layer_{i}/output_bottleneck_norm", f"{_MB}.output.bottleneck.LayerNorm", "norm"),
)

MOBILEBERT_HEADS = (
    ("mlm/transform", "cls.predictions.transform.dense", "dense"),
    ("mlm/norm", "cls.predictions.transform.LayerNorm", "norm"),
    ("mlm/extra", "cls.predictions.dense.weight", "tensor"),  # [H - E, vocab] on both sides
    ("mlm/bias", "cls.predictions.bias", "tensor"),
    ("nsp/dense", "cls.seq_relationship", "dense"),
)


@dataclasses.dataclass(frozen=True)
class MobileBertSettings:
    """MobileBERT's bottleneck keys (`families.mobilebert.model.Bottleneck`, HF's names) and its embedding
    width, which HF always states (the token table is E wide even when E = H)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        main = hf_config._main(hf)
        block.update({key: main[key] for key in mobilebert.EXTRA_KEYS}, embedding_size=main["embedding_size"])

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Any) -> None:
        hf.update(dataclasses.asdict(mobilebert.settings(block)), embedding_size=cfg.embed_dim)


MOBILEBERT = HFModel(
    "mobilebert", "mobilebert", {"model": "MobileBertForPreTraining"}, prefix="mobilebert",
    layout=(names.Part("model", "encoder", "mobilebert",
                       (MOBILEBERT_EMBEDDINGS, MOBILEBERT_LAYER, names.BERT_POOLER), trunk=True),
            names.Part("model", "", "", (MOBILEBERT_HEADS,), trunk=False)),
    # classifier_activation is our pooler (dense + tanh on the first token, or the token as is)
    keys=(*ENCODER_KEYS, ("pooler", "classifier_activation")), activation=("hidden_act", {"relu": "relu", **GELUS}),
    fixed={k: v for k, v in ENCODER.items() if k != "embedding_size"},
    defaults={**{k: v for k, v in BERT_DEFAULTS.items() if k != "position_embedding_type"}, "hidden_size": 512,
              "num_hidden_layers": 24, "num_attention_heads": 4, "intermediate_size": 512, "hidden_act": "relu",
              "hidden_dropout_prob": 0.0, "embedding_size": 128,
              "trigram_input": True, "use_bottleneck": True, "intra_bottleneck_size": 128,
              "use_bottleneck_attention": False, "key_query_shared_bottleneck": True, "num_feedforward_networks": 4,
              "normalization_type": "no_norm", "classifier_activation": True, "tie_word_embeddings": True},
    tokenizer="MobileBertTokenizer", required={"tie_word_embeddings": True}, written={"pad_token_id": 0},
    translations=(MobileBertSettings(),),
    tied={"cls.predictions.decoder.weight": "mobilebert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="mobilebert.pooler.dense.weight",
)

HF_RECORDS = (MOBILEBERT,)
