"""ELECTRA pretraining (Clark et al. 2020): a small generator's samples, a discriminator that
spots them. Loss = L_MLM + 50 · L_Disc over every real token.

    python -m bertology.pretrain --config configs/electra.py:tiny --workdir runs/electra_tiny

The paper's efficiency ablations are configs of this one (arguments `tiny_15`, `tiny_replace_mlm`,
`tiny_all_tokens_mlm`, and likewise for small/base/large):
  <preset>_15               discriminator loss only on the masked 15%
  <preset>_replace_mlm      masked tokens replaced by generator samples, an MLM predicts them
  <preset>_all_tokens_mlm   as Replace MLM, predicting every token
Masked positions: 85% [MASK], 15% unchanged (the reference code); 15% of the tokens are masked
(25% for large), at most max_predictions_per_seq = int((masked_lm_prob + 0.005) · max_seq_length)
per row. The discriminator is saved under params['discriminator'] and is what fine-tuning and
export load.
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import ELECTRA_SIZES, factorized_preset

VARIANTS = {"": "electra", "15": "electra_15", "replace_mlm": "replace_mlm", "all_tokens_mlm": "all_tokens_mlm"}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(size + (f"_{v}" if v else "") for size in ELECTRA_SIZES for v in VARIANTS)


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    preset, _, variant = arg.partition("_")
    paper = preset != "tiny"
    objective = ml_collections.ConfigDict(dict(name="electra", disc_weight=50.0, variant=VARIANTS.get(variant, variant)))
    c = recipes.pretraining(factorized_preset(ELECTRA_SIZES, preset), family="electra", objective=objective, paper=paper)
    c.model.update(pooler=False, generator_fraction=1 / 3 if preset == "base" else 0.25,
                   discriminator_head="mlm" if "mlm" in variant else "rtd")
    c.data.update(masking="dynamic", mask_prob=0.85, random_prob=0.0)
    c.data.max_seq_length = {"tiny": 128, "small": 128}.get(preset, 512)
    # The reference (configure_pretraining.py) derives the cap after every hparam override:
    # int((mask_prob + 0.005) * max_seq_length). A lazy reference does the same for the preset's
    # rate below and for --config.data.masked_lm_prob / max_seq_length overrides; setting
    # max_predictions_per_seq itself replaces it. Files and copies hold the resolved number
    # (to_json, to_dict), so config.json, resumes and the sweep (which rescales the number) see an
    # int. (to_int's op is a lambda, so this ConfigDict does not pickle; nothing here pickles one.)
    rate, length = c.data.get_ref("masked_lm_prob"), c.data.get_ref("max_seq_length")
    c.data.max_predictions_per_seq = ((rate + 0.005) * length).to_int()
    if preset == "tiny":
        c.optimizer.learning_rate = 1e-3
    elif preset == "small":
        c.batch_size, c.total_steps = 128, 1_000_000
        c.optimizer.update(learning_rate=5e-4, warmup_steps=10_000)
    else:
        c.batch_size, c.total_steps = (256, 766_000) if preset == "base" else (2048, 400_000)
        c.optimizer.update(learning_rate=2e-4, warmup_steps=10_000)
    if preset == "large":
        c.data.masked_lm_prob = 0.25  # the paper's table 6; the cap follows: 130 of 512
    return c
