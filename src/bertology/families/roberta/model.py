"""RoBERTa for pretraining: the shared encoder and an MLM head; no next-sentence head.

The architecture is BERT's; the differences are data and recipe (full-sentence inputs, dynamic
masking, byte-level BPE) plus two embedding details set in the config: one segment type, and
position ids that start at 2 because the reference tables reserve slots for the padding index.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.heads import MaskedLMHead
from bertology.models.transformer import Encoder, TransformerConfig


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, max_predictions, vocab]. `stack`: the encoder class, the core's
    or a family's own stack under RoBERTa's MLM model (Longformer's, DeBERTa's)."""

    cfg: TransformerConfig
    stack: Callable[..., nn.Module] = Encoder

    def setup(self):
        self.encoder = self.stack(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        out = self.encoder(batch, deterministic=deterministic, outputs_at=batch["masked_positions"])
        return {"mlm_logits": self.mlm(out["sequence"], self.encoder.attend)}


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    return flops.masked_lm(encoder_config(config.model), config.data.max_seq_length,
                           config.data.max_predictions_per_seq, nominal)


FAMILY = Family(Model, trunk, flops_per_token)
