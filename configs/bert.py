"""BERT pretraining (MLM + NSP), Devlin et al. 2019.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/bert_tiny
    python -m bertology.pretrain --config configs/bert.py:base --config.total_steps=1000

The argument is the preset (tiny, mini, small, medium, base, large). The small presets get a
recipe that shows learning within minutes on a CPU; base and large get the paper's (batch 256,
lr 1e-4, 10k warmup, 1M steps, AdamW with decay 0.01). Whole-word masking (BERT-wwm) is
`--config.data.mask_unit=whole_word` (Chinese whole words: add `--config.data.word_segmenter=jieba`
and a Chinese vocab); ERNIE's phrase/entity masking is
`--config.data.mask_unit=entity --config.data.lexicon=FILE`.

BERT's two-phase schedule (90% of the steps at 128 tokens, the rest at 512), in one workdir:

    python -m bertology.pretrain --config configs/bert.py:base_phase1 --workdir runs/bert_base
    python -m bertology.pretrain --config configs/bert.py:base_phase2 --workdir runs/bert_base
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES) + tuple(f"{size}_{phase}" for size in ("base", "large") for phase in ("phase1", "phase2"))
# BERT's two phases (Devlin et al. 2019, A.2): 90% of the steps at 128 tokens, then 512 (80 predictions per row)
PHASE_ONE_SHARE, PHASE_TWO_DATA = 0.9, dict(max_seq_length=512, max_predictions_per_seq=80)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    size, _, phase = preset.partition("_")
    c = recipes.pretraining(bert_preset(size), family="bert", objective="bert", paper=size not in recipes.SMALL_PRESETS)
    return two_phases(c, phase) if phase else c


def two_phases(c: ml_collections.ConfigDict, phase: str) -> ml_collections.ConfigDict:
    """One run in two invocations on the same --workdir: `phase1` stops at 90% of the steps on
    the whole run's learning-rate schedule; `phase2` resumes it there with 512-token rows, the
    shapes being the only keys it may change, and finishes the schedule."""
    if phase not in ("phase1", "phase2"):
        raise UserError(f"unknown phase {phase!r} in the preset; use <size>_phase1 then <size>_phase2")
    c.optimizer.schedule_steps = c.total_steps
    if phase == "phase1":
        c.total_steps = int(PHASE_ONE_SHARE * c.total_steps)
    else:
        c.data.update(PHASE_TWO_DATA)
        c.allow_config_change = "total_steps,data.max_seq_length,data.max_predictions_per_seq"
    return c
