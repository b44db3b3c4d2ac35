"""MobileBERT (Sun et al. 2020): progressive knowledge transfer from a BERT teacher, then
pretraining distillation, one run per stage.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/teacher
    python -m bertology.pretrain --config configs/mobilebert.py:tiny,0 --workdir runs/mb/0 \
        --config.teacher_checkpoint=runs/teacher
    python -m bertology.pretrain --config configs/mobilebert.py:tiny,1 --workdir runs/mb/1 \
        --config.teacher_checkpoint=runs/teacher --config.init_checkpoint=runs/mb/0
    python -m bertology.pretrain --config configs/mobilebert.py:tiny --workdir runs/mb/distill \
        --config.teacher_checkpoint=runs/teacher --config.init_checkpoint=runs/mb/1

The argument is `PRESET` (the pretraining-distillation stage) or `PRESET,L` (the transfer stage
of layer L, 0-based, run for `STEPS[preset][0]` steps); stage L > 0 starts from stage L - 1's run.
Transfer stages train without weight decay, so the layers they do not train stay bit-identical
(`families/mobilebert/objective.py`); for `tiny` at lr 1e-2 (a stage's loss halves in 20 CPU steps,
against a 1% fall at the small recipe's 1e-3).

The teacher is a plain BERT of the student's width, depth and heads (IB-BERT was never
released): for `tiny`, `configs/bert.py:tiny` (L2/H128, 2 heads); for `base`, `configs/bert.py:base`
with `--config.model.num_layers=24 --config.model.hidden_size=512 --config.model.num_heads=4
--config.model.intermediate_size=2048`. `base` is the paper's MobileBERT (24 layers, H 512,
bottleneck 128, 4 heads, FFN 512 x 4 stacked, embedding 128 with trigram input, NoNorm, ReLU;
the reference's `uncased_L-24_H-128_B-512_A-4_F-4_OPT.json`) with its recipe: LAMB lr 1.5e-3,
batch 2048 x 512. The reference trains 500K steps, "240K distill"; read here as 24 transfer
stages of 10K steps (240K) and 260K of pretraining distillation (not checked against the code).
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError

SIZES = {  # the student; its teacher has num_layers, hidden_size and num_heads of it
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=128, embedding_size=32,
                 intra_bottleneck_size=32, num_feedforward_networks=2),
    "base": dict(num_layers=24, hidden_size=512, num_heads=4, intermediate_size=512, embedding_size=128,
                 intra_bottleneck_size=128, num_feedforward_networks=4),
}
STEPS = {"tiny": (100, 400), "base": (10_000, 260_000)}  # (steps per transfer stage, distillation steps)

# The presets get_config takes; tests run each through validation.
# Each size distils ("tiny") and transfers its first and last layer ("tiny,0", "tiny,1").
PRESETS = tuple(a for size, s in SIZES.items() for a in (size, f"{size},0", f"{size},{s['num_layers'] - 1}"))


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    preset, _, stage = arg.partition(",")
    if preset not in SIZES:
        raise UserError(f"unknown MobileBERT preset {preset!r}; use one of {', '.join(SIZES)}")
    paper = preset == "base"
    c = recipes.pretraining(SIZES[preset], family="mobilebert", objective={"name": "mobilebert", "stage": "distill"},
                            paper=paper)
    c.model.update(activation="relu", dropout_rate=0.0, trigram_input=True, use_bottleneck=True,
                   use_bottleneck_attention=False, key_query_shared_bottleneck=True, normalization_type="no_norm")
    per_stage, distill = STEPS[preset]
    c.total_steps = distill
    if paper:
        c.batch_size, c.data.max_seq_length = 2048, 512
        # The reference's flags (google-research/mobilebert README, run_pretraining:
        # --max_seq_length=512 --max_predictions_per_seq=20, recipes.pretraining's 20) cap a full
        # row at 20 of the round(0.15 · 512) = 77 predictions the rate asks for, on purpose.
        c.data.allow_capped_predictions = True
        c.optimizer.update(name="lamb", learning_rate=1.5e-3)
    if stage:
        if not stage.isdigit() or int(stage) >= c.model.num_layers:
            raise UserError(f"MobileBERT stage {stage!r} is not a layer of the {c.model.num_layers}-layer student; "
                            f"use {preset},0 .. {preset},{c.model.num_layers - 1}, or {preset} to distil")
        c.objective = {"name": "mobilebert", "stage": "transfer", "layer": int(stage)}
        c.total_steps = per_stage
        c.optimizer.update(weight_decay=0.0, warmup_steps=min(c.optimizer.warmup_steps, per_stage // 10))
        if not paper:  # the feature-map terms move ~10x slower than MLM at the small recipe's 1e-3
            c.optimizer.learning_rate = 1e-2
    return c
