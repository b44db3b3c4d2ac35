"""SpanBERT pretraining (Joshi et al. 2020): span masking and the span boundary objective.

    python -m bertology.pretrain --config configs/spanbert.py:tiny --workdir runs/spanbert_tiny

Spans of whole words with lengths ~ Geometric(0.2) clipped at 10, a 15% budget, 80/10/10 decided
per span; single-segment rows (no NSP); MLM + SBO. Presets as BERT's (tiny ... large).
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    paper = preset not in recipes.SMALL_PRESETS
    c = recipes.pretraining(bert_preset(preset), family="spanbert", objective="spanbert", paper=paper)
    c.data.update(instances="full_sentences", mask_unit="span", masking="dynamic")
    if paper:
        c.data.update(max_seq_length=512, max_predictions_per_seq=77)
        c.optimizer.update(learning_rate=1e-4, warmup_steps=10_000)
        c.total_steps = 2_400_000
    return c
