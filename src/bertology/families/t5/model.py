"""T5 (Raffel et al. 2020), T5 v1.1 and mT5 (Xue et al. 2021): a pre-LN encoder-decoder with
RMSNorm, no biases, unscaled attention scores, and relative position biases instead of a table.

All three are settings of the shared core (`norm="pre"`, `norm_kind="rmsnorm"`, `use_bias=False`,
`scale_attention=False`, `positions="relative_bias"`, a free `head_size`); each stack computes its
bias once and adds it in every layer (bidirectional buckets in the encoder, causal ones in the
decoder, none in cross-attention). What this module adds is the output layer, where v1.0 and
v1.1 differ (`tie_embeddings`, the family's one extra key):
- v1.0 ties it to the shared token table and scales the decoder states by d_model**-0.5 first
  (Mesh TensorFlow's convention, kept by every released checkpoint);
- v1.1 and mT5 have an untied `lm_head` and no scaling (their feed-forward is gated tanh-GELU,
  `activation="gated_gelu"`).
The decoder starts from the pad id 0 (`shift_right(targets, 0)`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.transformer import EncoderDecoder, init

EXTRA_KEYS = ("tie_embeddings",)


class Model(EncoderDecoder):
    """Target logits [batch, target length, vocab] float32 (`logits`) under teacher forcing, or
    for the new tokens with `decode=True` (see `EncoderDecoder`)."""

    tie_embeddings: bool = True

    def setup(self):
        super().setup()
        if not self.tie_embeddings:
            self.lm_head = nn.Dense(self.cfg.padded_vocab_size, use_bias=False, kernel_init=init(self.cfg, ("embed", "vocab")),
                                    dtype=self.cfg.compute_dtype, name="lm_head")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True,
                 decode: bool = False) -> dict[str, jax.Array]:
        x = super().__call__(batch, deterministic=deterministic, decode=decode)
        if self.tie_embeddings:
            logits = self.attend(x * self.cfg.hidden_size ** -0.5)
        else:
            logits = self.lm_head(x)
        return {"logits": self.cfg.real_logits(logits.astype(jnp.float32))}


def build(model_config: ml_collections.ConfigDict | dict) -> Model:
    return Model(encoder_config(model_config), tie_embeddings=dict(model_config).get("tie_embeddings", True))


def trunk(params: dict) -> dict:
    """The encoder (token table included), which classification, tagging and QA heads and
    `bertology.features` read, as Hugging Face's encoder-only models do; the decoder is for
    generation. It has no pooler: sequence-level heads read the first token's state."""
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Both stacks, cross-attention and the output layer at every target position, per source token."""
    return flops.encoder_decoder(encoder_config(config.model), config.data.max_seq_length,
                                 config.data.max_target_length)


FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, build=build)
