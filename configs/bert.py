"""BERT pretraining (MLM + NSP), Devlin et al. 2019.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/bert_tiny
    python -m bertology.pretrain --config configs/bert.py:base --config.total_steps=1000

The argument is the preset (tiny, mini, small, medium, base, large). The small presets get a
recipe that shows learning within minutes on a CPU; base and large get the paper's (batch 256,
lr 1e-4, 10k warmup, 1M steps, AdamW with decay 0.01). Whole-word masking (BERT-wwm) is
`--config.data.mask_unit=whole_word`; ERNIE's phrase/entity masking is
`--config.data.mask_unit=entity --config.data.lexicon=FILE`.
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    return recipes.pretraining(bert_preset(preset), family="bert", objective="bert",
                               paper=preset not in recipes.SMALL_PRESETS)
