"""Skip-Thought (Kiros et al. 2015, "Skip-Thought Vectors"): an encoder reads a sentence into one
vector, and two decoders, one for the sentence before it and one for the sentence after it,
generate those neighbours word by word conditioned on that vector; the decoders share the
vocabulary (here the whole token table, tied to their output layer).

The paper's encoder and decoders were GRUs, the decoders conditioned on the vector at every step;
here all three are the core's Transformer stacks: the encoder's `pooled` vector (its first
token's state through the pooler) is the one key and value the decoders' cross-attention reads,
so every decoder position sees the sentence only through that vector, as the paper's decoders do.
Rows hold each sentence with its two neighbours (`families/skip_thought/data.py`). Downstream,
the encoder is the fine-tuning trunk (the shared `Encoder`) and `pooled` the sentence vector
the paper's linear classifiers read.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.transformer import Decoder, Encoder, Mask, TransformerConfig

Array = jax.Array
NEIGHBOURS = ("previous", "next")


class Model(nn.Module):
    """{previous_logits, next_logits} ([B, L, vocab], teacher forced: each decoder reads its target
    shifted right behind [CLS], `<side>_inputs`) and `sentence`, the encoder's vector [B, H]."""

    cfg: TransformerConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        decoder = dataclasses.replace(self.cfg, pooler=False)
        self.decoders = {side: Decoder(decoder, cross=True, shared_embeddings=self.encoder.embeddings, name=side)
                         for side in NEIGHBOURS}

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        sentence = self.encoder({k: batch[k] for k in ("input_ids", "input_mask")}, deterministic=deterministic)["pooled"]
        context, context_mask = sentence[:, None, :], Mask(keys=jnp.ones((sentence.shape[0], 1), bool))
        out = {"sentence": sentence}
        for side, decoder in self.decoders.items():
            target = {"input_ids": batch[f"{side}_inputs"], "input_mask": batch[f"{side}_mask"]}
            states = decoder(target, deterministic=deterministic, context=context, context_mask=context_mask)["sequence"]
            out[f"{side}_logits"] = self.cfg.real_logits(self.encoder.attend(states).astype(jnp.float32))
        return out


def trunk(params: dict) -> dict:
    """The encoder: what fine-tuning and features read (the decoders only train it)."""
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The encoder and both decoders over the row's length, and each decoder's tied softmax."""
    cfg, length = encoder_config(config.model), config.data.max_seq_length
    return flops.TRAIN * (3 * flops.stack(cfg, length, nominal=nominal) + 2 * flops.lm_head(cfg, transform=False))


FAMILY = Family(Model, trunk, flops_per_token)
