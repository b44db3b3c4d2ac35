"""Megatron-BERT (Shoeybi et al. 2019, "Megatron-LM"): BERT with the LayerNorm moved.

The network is BERT's pretraining model (the shared encoder, a tied MLM head and a two-way
classifier on the pooled first token); what differs is where the LayerNorms sit, as in
NVIDIA's Megatron-LM and Hugging Face's `MegatronBertModel`:
- no LayerNorm on the summed embeddings (HF's `MegatronBertEmbeddings` comments it out);
- pre-LN layers: a norm before self-attention (HF's `attention.ln`) and one before the
  feed-forward block (the layer's `ln`), each residual adding the sublayer's output to its
  un-normalised input;
- one final LayerNorm after the stack (HF's `encoder.ln`), which the pooler and the MLM head read.

All three are settings of the shared core (`norm="pre"`, `embedding_norm=False`), so this family
is BERT's model with a config that holds them: a `model` block may leave them out, and one that
asks for BERT's post-LN or an embedding norm is refused rather than trained as a different
network under this family's name. The binary head is HF's `seq_relationship` (named NSP there);
Megatron-LM trains it on sentence order (its "random next" swaps the two segments), which the
configs choose through `data.sentence_task` (`configs/megatron_bert.py`).
"""

from __future__ import annotations

from bertology.families.bert.model import Model, flops_per_token, trunk
from bertology.models import Family, ModelConfig, fixed_architecture
from bertology.models.transformer import TransformerConfig

# What makes the core compute Megatron-BERT rather than BERT.
ARCHITECTURE = {"norm": "pre", "embedding_norm": False}


def config(model_config: ModelConfig) -> TransformerConfig:
    """The trunk's config: the block's `TransformerConfig` with `ARCHITECTURE` filled in where the
    block leaves it out; a block that sets any of it otherwise is refused."""
    return fixed_architecture(model_config, ARCHITECTURE, "Megatron-BERT", "(pre-LN layers, a final LayerNorm, none "
                              "on the embeddings); for BERT's post-LN network use model.family='bert'")


# BERT's network, heads and FLOP count on the Megatron core settings; the stack's layer names are
# the shared core's (`attention_{i}`, `ffn_{i}`), so the default `layer_index` places them.
FAMILY = Family(Model, trunk, flops_per_token, config=config)
