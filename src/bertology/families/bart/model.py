"""BART (Lewis et al. 2020): a post-LN encoder-decoder denoiser with learned positions; also the
network of MASS (Song et al. 2019), which is the same shape of model trained on another noising.

Everything but the output bias is a setting of the shared core: post-LN, GELU, LayerNorm on the
embeddings of each stack (`layernorm_embedding`), learned positions counted from 2
(`position_offset=2`: fairseq reserves the first rows of the table), optional sqrt(d) token
scaling (`scale_embeddings`). Encoder and decoder have their own position tables and embedding
norms and share only the token table (`decoder_embeddings`). The output layer is tied to that
table plus `final_logits_bias` [vocab], kept as a constant as Hugging Face keeps it (a buffer in
PyTorch, behind `stop_gradient` in Flax; fairseq's BART has no output bias): it carries imported
values (zero in BART's released checkpoints) and is never trained, which also spares every step
a reduction over [tokens, vocab] for its gradient. The decoder starts from the end-of-sequence id
(`shift_right(targets, eos)`, fairseq's convention).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.transformer import EncoderDecoder, zeros


class Model(EncoderDecoder):
    """Target logits [batch, target length, vocab] float32 (`logits`) under teacher forcing, or
    for the new tokens with `decode=True` (see `EncoderDecoder`)."""

    decoder_start = "eos"  # fairseq's, and its Hugging Face checkpoints' decoder_start_token_id

    decoder_embeddings: bool = True

    def setup(self):
        super().setup()
        self.final_logits_bias = self.param("final_logits_bias", zeros(("vocab",)), (self.cfg.padded_vocab_size,))

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True,
                 decode: bool = False) -> dict[str, jax.Array]:
        x = super().__call__(batch, deterministic=deterministic, decode=decode)
        logits = self.attend(x).astype(jnp.float32) + jax.lax.stop_gradient(self.final_logits_bias)
        return {"logits": self.cfg.real_logits(logits)}



def init_from(params: dict, fresh: dict) -> dict:
    """Family contract: start from another family's checkpoint. A BERT run fills an encoder of
    BERT's shapes (configs/bert2bert.py, the BERT-as-encoder route); the decoder stays fresh."""
    from bertology.families.unilm.model import from_bert

    return from_bert(params, fresh)


def trunk(params: dict) -> dict:
    """The encoder (token table included), which classification, tagging and QA heads and
    `bertology.features` read, as Hugging Face's encoder-only models do; the decoder is for
    generation. It has no pooler: sequence-level heads read the first token's state."""
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Both stacks, cross-attention and the output layer at every target position, per source token."""
    return flops.encoder_decoder(encoder_config(config.model), config.data.max_seq_length,
                                 config.data.max_target_length)


FAMILY = Family(Model, trunk, flops_per_token, init_from=init_from)
