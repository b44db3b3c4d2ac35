"""SpanBERT for pretraining: the shared encoder, an MLM head and the span boundary head.

Inputs are single segments with spans masked (data.mask_unit='span' provides `span_start` and
`span_end` for every prediction slot); there is no next-sentence head.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.models.encoder import Encoder, EncoderConfig
from bertology.models.heads import MaskedLMHead, SpanBoundaryHead


class Model(nn.Module):
    """Outputs `mlm_logits` and `sbo_logits`, both [batch, max_predictions, vocab]."""

    cfg: EncoderConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.sbo = SpanBoundaryHead(self.cfg, name="sbo")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        positions = batch["masked_positions"]
        left, right = SpanBoundaryHead.boundaries(batch["span_start"], batch["span_end"], batch["input_ids"].shape[1])
        out = self.encoder(batch["input_ids"], batch["input_mask"], positions=batch.get("positions"),
                           packing_ids=batch.get("packing_ids"), deterministic=deterministic,
                           outputs_at=jnp.concatenate([positions, left, right], axis=1))
        masked, left, right = jnp.split(out["sequence"], 3, axis=1)
        return {
            "mlm_logits": self.mlm(masked, self.encoder.attend),
            "sbo_logits": self.sbo(left, right, positions, batch["span_start"], self.encoder.attend),
        }
