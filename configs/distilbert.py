"""DistilBERT (Sanh et al. 2019): a 6-layer student distilled from a BERT teacher.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/teacher
    python -m bertology.pretrain --config configs/distilbert.py:tiny --workdir runs/distil \
        --config.teacher_checkpoint=runs/teacher

The argument is the *teacher's* BERT preset: the student has its width and half its layers (6
for base), taken from the teacher's layers [0, 2, 4, 7, 9, 11] (`families/distilbert/model.py` gives the
rule for other depths), with no segment table, no pooler and no NSP. Loss 5·KL(T=2) + 2·MLM +
1·cosine over every non-pad token (`objectives/distil.py`); dynamic masking of whole-sentence
rows, as RoBERTa's. Base uses the reference's optimisation (HF `examples/research_projects/
distillation`): AdamW b2 0.98, eps 1e-6, lr 5e-4, 5% warmup, clip 5, large batches (the
reference's 5 x 50 accumulation per GPU x 8 GPUs = 2000 sequences per step, here 4096 x 512 in
the style of RoBERTa; the reference trains 3 epochs on its corpus).
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)


def get_config(teacher_preset: str = "base") -> ml_collections.ConfigDict:
    paper = teacher_preset not in recipes.SMALL_PRESETS
    sizes = bert_preset(teacher_preset)
    sizes["num_layers"] = max(1, sizes["num_layers"] // 2)
    c = recipes.pretraining(sizes, family="distilbert", objective="distil", paper=paper)
    c.model.update(type_vocab_size=0, pooler=False)
    c.data.update(instances="full_sentences", masking="dynamic")
    c.optimizer.update(b2=0.98, eps=1e-6, clip_norm=5.0)
    if paper:
        c.batch_size, c.grad_accum_steps = 4096, 16
        c.total_steps = 100_000
        c.optimizer.update(learning_rate=5e-4, warmup_steps=5_000)
    return c
