"""ModernBERT's Hugging Face record (`ModernBertForMaskedLM`, transformers' `models/modernbert`).

HF fuses what the core keeps apart: `attn.Wqkv` is one Linear [3H, H] holding the query, key
and value projections in that order (`qkv.view(bs, -1, 3, heads, head_dim)`), and `mlp.Wi` one
Linear [2I, H] holding the GeGLU's input (first half, through the GELU) and gate (second half):
the fused rows `(j, n)` of `names`. Layer 0 has no `attn_norm` (an `nn.Identity`), which the
name table's row for it skips since our first layer has none either (`first_attention_norm=False`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.interop import names
from bertology.interop.records import CORE, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """ModernBertConfig's special ids default to the OLMo tokenizer's (pad 50283, cls 50281, sep
    50282), outside a smaller table, where HF's embedding refuses the padding index: export names
    the run tokenizer's ids ([CLS] begins, [SEP] ends), or none without a tokenizer. They do not
    change what the network computes, so import reads none of them."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        pass

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if tokenizer is None:
            hf.update(pad_token_id=None, cls_token_id=None, sep_token_id=None, bos_token_id=None, eos_token_id=None)
        else:
            hf.update(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id,
                      bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)

MODERNBERT_EMBEDDINGS = (
    ("embeddings/token", "embeddings.tok_embeddings", "embedding"),
    ("embeddings/norm", "embeddings.norm", "norm"),
)
MODERNBERT_LAYER = (
    ("attention_{i}/norm", "layers.{i}.attn_norm", "norm"),  # absent at layer 0, on both sides
    ("attention_{i}/query", "layers.{i}.attn.Wqkv", "to_heads", (0, 3)),
    ("attention_{i}/key", "layers.{i}.attn.Wqkv", "to_heads", (1, 3)),
    ("attention_{i}/value", "layers.{i}.attn.Wqkv", "to_heads", (2, 3)),
    ("attention_{i}/output", "layers.{i}.attn.Wo", "from_heads"),
    ("ffn_{i}/norm", "layers.{i}.mlp_norm", "norm"),
    ("ffn_{i}/intermediate", "layers.{i}.mlp.Wi", "dense", (0, 2)),
    ("ffn_{i}/intermediate_linear", "layers.{i}.mlp.Wi", "dense", (1, 2)),
    ("ffn_{i}/output", "layers.{i}.mlp.Wo", "dense"),
)
MODERNBERT_FINAL_NORM = (("final_norm", "final_norm", "norm"),)
MODERNBERT_HEADS = (  # relative to the model root
    ("mlm/transform", "head.dense", "dense"),
    ("mlm/norm", "head.norm", "norm"),
    ("mlm/bias", "decoder.bias", "tensor"),
)

MODERNBERT_KEYS = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("layer_norm_eps", "norm_eps"),
    ("initializer_range", "initializer_range"),
    ("rope_theta", "global_rope_theta"),
    ("local_rope_theta", "local_rope_theta"),
    ("local_attention", "local_attention"),
    ("global_attn_every_n_layers", "global_attn_every_n_layers"),
)

# transformers 4.57.6's ModernBertConfig() for every key read here
MODERNBERT_DEFAULTS = dict(
    vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
    hidden_activation="gelu", max_position_embeddings=8192, initializer_range=0.02, norm_eps=1e-5, norm_bias=False,
    global_rope_theta=160000.0, attention_bias=False, attention_dropout=0.0, global_attn_every_n_layers=3,
    local_attention=128, local_rope_theta=10000.0, embedding_dropout=0.0, mlp_bias=False, mlp_dropout=0.0,
    decoder_bias=True, classifier_bias=False, classifier_activation="gelu",
)

MODERNBERT = HFModel(
    "modernbert", "modernbert", {"model": "ModernBertForMaskedLM"},
    layout=(names.Part("model", "encoder", "model", (MODERNBERT_EMBEDDINGS, MODERNBERT_LAYER, MODERNBERT_FINAL_NORM),
                       trunk=True),
            names.Part("model", "", "", (MODERNBERT_HEADS,), trunk=False)),
    prefix="model", keys=MODERNBERT_KEYS,
    activation=("hidden_activation", {"gelu": "geglu"}),  # ACT2FN["gelu"]: the erf GELU, gating the input half
    fixed={**{k: v for k, v in CORE.items() if k not in ("use_bias", "positions")},
           "norm": "pre", "embedding_norm": True, "first_attention_norm": False, "use_bias": False,
           "norm_bias": False, "positions": "rotary", "type_vocab_size": 0, "pooler": False,
           # HF's dropouts sit elsewhere than ours (after the GELU, on the embeddings, on the attention
           # output); ModernBERT trains without any, so both sides have none
           "dropout_rate": 0.0, "attention_dropout_rate": 0.0},
    imported={"scale_residual_init": True},  # HF's init: the output projections' std / sqrt(2 · layers)
    defaults=MODERNBERT_DEFAULTS, tokenizer="PreTrainedTokenizerFast",
    required=dict(norm_bias=False, attention_bias=False, mlp_bias=False, decoder_bias=True, classifier_bias=False,
                  classifier_activation="gelu", attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0),
    translations=(SpecialTokens(),),
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
)

HF_RECORDS = (MODERNBERT,)
