"""BigBird (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences", arXiv 2007.14062;
reference code github.com/google-research/bigbird, and Hugging Face's `BigBirdForMaskedLM`,
transformers' `models/big_bird/modeling_big_bird.py`).

The network is BERT's post-LN encoder (learned absolute positions from 0, segment embeddings,
pooler) with an MLM head, and one difference: self-attention is block-sparse
(`bertology.models.block_sparse`, the core's `sparse_block_size` and `num_random_blocks`), the
ITC pattern of the paper: blocks of `sparse_block_size` tokens, the first and last blocks global,
every other block seeing a 3-block window and `num_random_blocks` random blocks. Rows too short
for the pattern attend fully (HF's `max_tokens_to_attend`), and a model with `sparse_block_size`
None is HF's `attention_type="original_full"`. The released checkpoints (bigbird-roberta-*) were
trained as RoBERTa is, MLM alone on full sentences, with the tanh GELU (`hidden_act="gelu_new"`)
and unscaled token embeddings (`rescale_embeddings=False`: the core's `scale_embeddings`).

Evaluation matches HF's evaluation mode to float32 rounding (random blocks included: see
`block_sparse` for HF 4.57.6's evaluation table). Training differs from HF's in two places that
do not change the parameters' meaning: the random blocks are drawn afresh each step rather than
fixed per layer, and the embeddings' dropout comes after their LayerNorm (the core's order; HF's
`BigBirdEmbeddings` drops before it).

So the module is RoBERTa's (encoder, MLM head read at the masked positions) on a config that
holds BERT's layout (`ARCHITECTURE`); a block setting any of it otherwise is refused. The FLOP
count is RoBERTa's, attention over the whole row: an upper bound for block-sparse layers.
"""

from __future__ import annotations

from bertology.families.roberta.model import Model, flops_per_token, trunk
from bertology.models import Family, ModelConfig, fixed_architecture
from bertology.models.transformer import TransformerConfig

# What makes the core compute BigBird's layout (the attention pattern is the block's own setting).
ARCHITECTURE = {
    "norm": "post",
    "norm_kind": "layernorm",
    "embedding_norm": True,
    "positions": "absolute",
    "position_offset": 0,
}


def config(model_config: ModelConfig) -> TransformerConfig:
    """The trunk's config: the block's `TransformerConfig` with `ARCHITECTURE` filled in where the
    block leaves it out; a block that sets any of it otherwise is refused."""
    return fixed_architecture(model_config, ARCHITECTURE, "BigBird", "(BERT's post-LN encoder with learned "
                              "absolute positions from 0)")


FAMILY = Family(Model, trunk, flops_per_token, config=config)
