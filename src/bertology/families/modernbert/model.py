"""ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional
Encoder for Fast, Memory Efficient, and Long Context Finetuning and Inference", arXiv 2412.13663;
reference code github.com/AnswerDotAI/ModernBERT, and Hugging Face's `ModernBertForMaskedLM`,
transformers' `models/modernbert/modeling_modernbert.py`).

The network is an encoder with an MLM head, like RoBERTa's, with every difference a setting of
the shared core (`ARCHITECTURE`):
- pre-LN layers with a final norm (HF `ModernBertModel.final_norm`), a LayerNorm on the token
  embeddings (`embeddings.norm`) and none before the first layer's attention (HF's layer-0
  `attn_norm` is `nn.Identity`): `norm="pre"`, `embedding_norm=True`, `first_attention_norm=False`;
- no biases in any dense layer or LayerNorm (`attention_bias`, `mlp_bias`, `norm_bias`,
  `classifier_bias` all False): `use_bias=False`, `norm_bias=False`; the MLM decoder keeps its
  bias (`decoder_bias=True`), which the shared MLM head always has;
- no position table and no segments: rotary embeddings of the queries and keys (`positions=
  "rotary"`, HF's `rotate_half` layout), base `rope_theta` (160000) in the global layers and
  `local_rope_theta` (10000) in the others;
- alternating attention: layer i is global when i % `global_attn_every_n_layers` (3) == 0, the
  others see only keys at most `local_attention // 2` (64) positions away (HF's
  `_update_attention_mask`: `distance <= local_attention // 2`);
- a GeGLU feed-forward block: HF's `Wi` projects to 2x`intermediate_size`, `input, gate =
  chunk(2)`, `Wo(gelu(input) * gate)` with the erf GELU (`hidden_activation="gelu"`):
  `activation="geglu"`, our `intermediate` being `Wi`'s first half and `intermediate_linear` its
  second;
- the MLM head (`ModernBertPredictionHead`): dense (no bias) + GELU + LayerNorm (no bias), then the
  decoder tied to the token table, plus a bias: the shared `MaskedLMHead` under these settings;
- no pooler (sequence classification pools itself in HF): `pooler=False`.

So the module is RoBERTa's (encoder, MLM head read at the masked positions, no sentence head) on
a config that holds these settings: a `model` block may leave them out, and one that sets any of
them otherwise is refused rather than trained as another network under this family's name.
Rotary positions are the row's own (`positions` when the data packs documents, else 0, 1, ...).
"""

from __future__ import annotations

from bertology.families.roberta.model import Model, flops_per_token, trunk
from bertology.models import Family, ModelConfig, fixed_architecture
from bertology.models.transformer import TransformerConfig

# What makes the core compute ModernBERT.
ARCHITECTURE = {
    "norm": "pre",
    "norm_kind": "layernorm",
    "embedding_norm": True,
    "first_attention_norm": False,
    "use_bias": False,
    "norm_bias": False,
    "positions": "rotary",
    "type_vocab_size": 0,
    "activation": "geglu",
    "pooler": False,
}


def config(model_config: ModelConfig) -> TransformerConfig:
    """The trunk's config: the block's `TransformerConfig` with `ARCHITECTURE` filled in where the
    block leaves it out; a block that sets any of it otherwise is refused."""
    return fixed_architecture(model_config, ARCHITECTURE, "ModernBERT", "(pre-LN without biases, rotary positions, "
                              "GeGLU, no segments or pooler)")


# RoBERTa's network, MLM head and FLOP count (the encoder at every token, its last layer at the
# predictions; attention counted over the whole row, as the xla backend computes a sliding
# window: the full scores, masked) on ModernBERT's settings; the stack's layer names are the
# shared core's (`attention_{i}`, `ffn_{i}`), so the default `layer_index` places them.
FAMILY = Family(Model, trunk, flops_per_token, config=config)
