"""BERT for pretraining: the shared encoder plus an MLM head and an NSP head."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertology.models.encoder import Encoder, EncoderConfig
from bertology.models.heads import ClassifierHead, MaskedLMHead


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, max_predictions, vocab] and `nsp_logits` [batch, 2]."""

    cfg: EncoderConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.nsp = ClassifierHead(self.cfg, num_classes=2, name="nsp")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        out = self.encoder(batch["input_ids"], batch["input_mask"], batch.get("segment_ids"),
                           deterministic=deterministic, outputs_at=batch["masked_positions"])
        return {
            "mlm_logits": self.mlm(out["sequence"], self.encoder.attend),
            "nsp_logits": self.nsp(out["pooled"]),
        }
