"""RoBERTa for pretraining: the shared encoder and an MLM head; no next-sentence head.

The architecture is BERT's; the differences are data and recipe (full-sentence inputs, dynamic
masking, byte-level BPE) plus two embedding details set in the config: one segment type, and
position ids that start at 2 because the reference tables reserve slots for the padding index.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertology.models.encoder import Encoder, EncoderConfig
from bertology.models.heads import MaskedLMHead


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, max_predictions, vocab]."""

    cfg: EncoderConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        out = self.encoder(batch["input_ids"], batch["input_mask"], positions=batch.get("positions"),
                           packing_ids=batch.get("packing_ids"), deterministic=deterministic,
                           outputs_at=batch["masked_positions"])
        return {"mlm_logits": self.mlm(out["sequence"], self.encoder.attend)}
