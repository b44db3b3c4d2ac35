"""ALBERT for pretraining: a factorized, layer-sharing encoder with MLM and sentence-order heads.

Factorization (`embedding_size` E < H) and cross-layer sharing (`share_layers`) are encoder
settings; what ALBERT adds as a model is only the SOP classifier in place of NSP. The MLM head
maps H back to E before the tied output projection.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.heads import ClassifierHead, MaskedLMHead
from bertology.models.transformer import Encoder, TransformerConfig


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, max_predictions, vocab] and `sop_logits` [batch, 2]."""

    cfg: TransformerConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.sop = ClassifierHead(self.cfg, num_classes=2, name="sop")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        out = self.encoder(batch, deterministic=deterministic, outputs_at=batch["masked_positions"])
        return {"mlm_logits": self.mlm(out["sequence"], self.encoder.attend), "sop_logits": self.sop(out["pooled"])}


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    return flops.masked_lm(encoder_config(config.model), config.data.max_seq_length,
                           config.data.max_predictions_per_seq, nominal, sentence=True)


FAMILY = Family(Model, trunk, flops_per_token)
