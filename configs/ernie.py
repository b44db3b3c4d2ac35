"""ERNIE 1.0 (Sun et al. 2019, "ERNIE: Enhanced Representation through Knowledge Integration"):
BERT's network and objective, trained with knowledge masking in three stages on one workdir.

    python -m bertology.pretrain --config configs/ernie.py:tiny_basic --workdir runs/ernie_tiny
    python -m bertology.pretrain --config configs/ernie.py:tiny_phrase --workdir runs/ernie_tiny
    python -m bertology.pretrain --config configs/ernie.py:tiny_entity --workdir runs/ernie_tiny

The stages (§3.2, "multi-stage knowledge masking"), each a third of the steps on one
learning-rate schedule, each resuming the one before:
- basic: basic language units are masked (words for English, as the paper says; whole words here);
- phrase: a few multi-word phrases are masked whole, with the other words as units
  (`data.mask_unit=entity` over a phrase lexicon; default: phrases common in the embedded corpus);
- entity: named entities are masked whole (`data.lexicon`: one per line; default: the embedded
  corpus's dotted standard-library names and a few proper names).
The paper found the phrases and entities with a chunker and an entity recogniser; a lexicon with
longest match on word boundaries stands in for them. It does not give the stages' shares; set
`STAGE_SHARES` in a copy of this file to change them. Its dialogue language model (on Baidu
Tieba dialogues) is not reproduced: the objective is BERT's MLM + NSP.

The preset is `<size>_<stage>` with the sizes of configs/bert.py (tiny ... large); `<size>` alone
trains the entity stage's masking from the start.
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError
from bertology.models.presets import BERT_SIZES, bert_preset

STAGES = {
    "basic": dict(mask_unit="whole_word", lexicon=None),
    "phrase": dict(mask_unit="entity", lexicon="phrases"),  # the shipped lists (bertology.data.embedded.LEXICONS)
    "entity": dict(mask_unit="entity", lexicon="entities"),
}
STAGE_SHARES = (1 / 3, 1 / 3, 1 / 3)  # of the run's steps, in the order of STAGES

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES) + tuple(f"{size}_{stage}" for size in BERT_SIZES for stage in STAGES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    size, _, stage = preset.partition("_")
    if size not in BERT_SIZES:
        raise UserError(f"unknown preset {preset!r}; use <size> or <size>_<stage> with a size of {', '.join(BERT_SIZES)}")
    c = recipes.pretraining(bert_preset(size), family="bert", objective="bert", paper=size not in recipes.SMALL_PRESETS)
    return staged(c, stage) if stage else _stage_data(c, "entity")


def _stage_data(c: ml_collections.ConfigDict, stage: str) -> ml_collections.ConfigDict:
    c.data.update(STAGES[stage])
    return c


def staged(c: ml_collections.ConfigDict, stage: str) -> ml_collections.ConfigDict:
    """One stage of the three on one --workdir: the run stops at the end of its stage's share of
    the whole run's steps, on the whole run's learning-rate schedule; a later stage resumes the
    workdir with its own masking, the masking keys being the only ones it may change."""
    if stage not in STAGES:
        raise UserError(f"unknown stage {stage!r} in the preset; use <size>_{', <size>_'.join(STAGES)} in turn")
    k = list(STAGES).index(stage)
    c.optimizer.schedule_steps = c.total_steps
    c.total_steps = round(c.total_steps * sum(STAGE_SHARES[: k + 1]))
    if k:
        c.allow_config_change = "total_steps,data.mask_unit,data.lexicon"
    return _stage_data(c, stage)
