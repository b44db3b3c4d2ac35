"""SpanBERT for pretraining: the shared encoder, an MLM head and the span boundary head.

Inputs are single segments with spans masked (data.mask_unit='span' provides `span_start` and
`span_end` for every prediction slot); there is no next-sentence head.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.heads import MaskedLMHead, SpanBoundaryHead
from bertology.models.transformer import Encoder, TransformerConfig


class Model(nn.Module):
    """Outputs `mlm_logits` and `sbo_logits`, both [batch, max_predictions, vocab]."""

    cfg: TransformerConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.sbo = SpanBoundaryHead(self.cfg, name="sbo")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        positions = batch["masked_positions"]
        left, right = SpanBoundaryHead.boundaries(batch["span_start"], batch["span_end"], batch["input_ids"].shape[1])
        out = self.encoder(batch, deterministic=deterministic, outputs_at=jnp.concatenate([positions, left, right], axis=1))
        masked, left, right = jnp.split(out["sequence"], 3, axis=1)
        return {
            "mlm_logits": self.mlm(masked, self.encoder.attend),
            "sbo_logits": self.sbo(left, right, positions, batch["span_start"], self.encoder.attend),
        }


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The last layer runs at each masked position and both of its span's boundaries (+ [CLS])."""
    predictions = config.data.max_predictions_per_seq
    return flops.masked_lm(encoder_config(config.model), config.data.max_seq_length, predictions, nominal,
                           rows=3 * predictions + 1, boundary=True)


FAMILY = Family(Model, trunk, flops_per_token)
