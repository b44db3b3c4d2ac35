"""BigBird's Hugging Face record (`BigBirdForMaskedLM`, transformers' `models/big_bird`).

The state dict is BERT's under `bert.` (`BigBirdModel`'s layers carry BERT's names), except the
pooler, a bare Linear (`bert.pooler`, not `bert.pooler.dense`). The attention pattern is config:
`attention_type` "block_sparse" with `block_size` and `num_random_blocks` is our
`sparse_block_size` and `num_random_blocks`; "original_full" is dense attention
(`sparse_block_size` None). `rescale_embeddings` (token embeddings x sqrt(hidden)) is our
`scale_embeddings`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.errors import UserError
from bertology.interop import names
from bertology.interop.records import CORE, ENCODER_KEYS, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer

ATTENTION_TYPES = ("block_sparse", "original_full")


@dataclasses.dataclass(frozen=True)
class AttentionType:
    """HF's `attention_type`, `block_size`, `num_random_blocks` <-> our `sparse_block_size`
    (None: "original_full") and `num_random_blocks`. An original_full export writes HF's default
    block settings, which it then never reads."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        main = next(iter(hf.values()))
        kind = main["attention_type"]
        if kind not in ATTENTION_TYPES:
            raise UserError(f"{next(iter(where.values()))}: attention_type={kind!r} is not one of {ATTENTION_TYPES}")
        sparse = kind == "block_sparse"
        block["sparse_block_size"] = main["block_size"] if sparse else None
        block["num_random_blocks"] = main["num_random_blocks"] if sparse else 0

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        sparse = cfg.sparse_block_size is not None
        hf.update(attention_type="block_sparse" if sparse else "original_full",
                  block_size=cfg.sparse_block_size if sparse else BIGBIRD_DEFAULTS["block_size"],
                  num_random_blocks=cfg.num_random_blocks if sparse else BIGBIRD_DEFAULTS["num_random_blocks"])


BIGBIRD_POOLER = (("pooler", "pooler", "dense"),)
BIGBIRD_HEADS = tuple(row for row in names.BERT_HEADS if not row[0].startswith("nsp"))  # BigBirdOnlyMLMHead

# transformers 4.57.6's BigBirdConfig() for every key read here
BIGBIRD_DEFAULTS = dict(
    vocab_size=50358, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu_new", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=4096,
    type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0, attention_type="block_sparse",
    use_bias=True, rescale_embeddings=False, block_size=64, num_random_blocks=3, is_decoder=False,
    add_cross_attention=False,
)

BIGBIRD = HFModel(
    "big_bird", "bigbird", {"model": "BigBirdForMaskedLM"},
    layout=(names.Part("model", "encoder", "bert", (names.EMBEDDINGS, names.BERT_LAYER, BIGBIRD_POOLER), trunk=True),
            names.Part("model", "", "", (BIGBIRD_HEADS,), trunk=False)),
    prefix="bert", keys=(*ENCODER_KEYS, ("scale_embeddings", "rescale_embeddings")),
    activation=("hidden_act", GELUS),
    fixed={**{k: v for k, v in CORE.items() if k != "scale_embeddings"}, "norm": "post", "embedding_norm": True,
           "local_attention": None},
    defaults=BIGBIRD_DEFAULTS, tokenizer="BigBirdTokenizer",
    required=dict(use_bias=True, is_decoder=False, add_cross_attention=False), written={"pad_token_id": 0},
    translations=(AttentionType(),),
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="bert.pooler.weight",
)

HF_RECORDS = (BIGBIRD,)
