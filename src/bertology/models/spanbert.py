"""SpanBERT for pretraining: the shared encoder, an MLM head and the span boundary head.

Inputs are single segments with spans masked (data.mask_unit='span' provides `span_start` and
`span_end` for every prediction slot); there is no next-sentence head.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertology.models.encoder import Encoder, EncoderConfig
from bertology.models.heads import MaskedLMHead, SpanBoundaryHead, gather_positions


class Model(nn.Module):
    """Outputs `mlm_logits` and `sbo_logits`, both [batch, max_predictions, vocab]."""

    cfg: EncoderConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.sbo = SpanBoundaryHead(self.cfg, name="sbo")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        out = self.encoder(batch["input_ids"], batch["input_mask"], positions=batch.get("positions"),
                           packing_ids=batch.get("packing_ids"), deterministic=deterministic)
        positions = batch["masked_positions"]
        return {
            "mlm_logits": self.mlm(gather_positions(out["sequence"], positions), self.encoder.attend),
            "sbo_logits": self.sbo(out["sequence"], positions, batch["span_start"], batch["span_end"],
                                   self.encoder.attend),
        }
