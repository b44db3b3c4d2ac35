"""StructBERT (Wang et al. 2020): BERT's network, two structural objectives.

The encoder and the MLM head are BERT's. The MLM head also predicts the word structural
objective's shuffled tokens (`families/structbert/data.py`), so the only new layer is the
sentence structural head: three classes (B follows A, B precedes A, B is from another document)
on the pooled [CLS], where BERT's NSP head has two. Fine-tuning reads the encoder alone.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertology.families.bert.model import flops_per_token, trunk
from bertology.models import Family
from bertology.models.heads import ClassifierHead, MaskedLMHead
from bertology.models.transformer import Encoder, TransformerConfig

SENTENCE_CLASSES = 3  # 0: B follows A; 1: B precedes A (the pair swapped); 2: B from another document


class Model(nn.Module):
    """Outputs `mlm_logits` [batch, max_predictions, vocab] and `sso_logits` [batch, 3]."""

    cfg: TransformerConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.mlm = MaskedLMHead(self.cfg, name="mlm")
        self.sso = ClassifierHead(self.cfg, num_classes=SENTENCE_CLASSES, name="sso")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        out = self.encoder(batch, deterministic=deterministic, outputs_at=batch["masked_positions"])
        return {"mlm_logits": self.mlm(out["sequence"], self.encoder.attend), "sso_logits": self.sso(out["pooled"])}


# BERT's trunk, and BERT's count: the encoder, the MLM head at the prediction slots (masked and
# shuffled tokens alike) and the sentence head
FAMILY = Family(Model, trunk, flops_per_token)
