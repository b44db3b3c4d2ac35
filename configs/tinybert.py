"""TinyBERT (Jiao et al. 2020): general distillation of a narrow, shallow BERT from a BERT teacher.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/teacher
    python -m bertology.pretrain --config configs/tinybert.py:tiny --workdir runs/tinybert \
        --config.teacher_checkpoint=runs/teacher

The argument is the *teacher's* BERT preset. For base the student is the paper's TinyBERT-4:
4 layers, width 312, FFN 1200, 12 heads (the teacher's head count, which attention distillation
needs), learning from teacher layers 3, 6, 9, 12 (`families/tinybert/model.py`); smaller teachers get a
student with half their layers and width and their heads. Losses: attention-score MSE, hidden
MSE through W_h, embedding MSE (`families/tinybert/objective.py`), no MLM. The text is fed unmasked (the
MLM transform with every chosen token kept, since nothing is predicted). Base follows the
reference's general distillation: lr 5e-5, batch 256, length 128 (its 3 epochs over Wikipedia
are this corpus's business).

Task-specific distillation (the prediction layer) is a fine-tuning option: `configs/finetune/
tinybert.py`, with a teacher fine-tuned on the same task.
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)


def get_config(teacher_preset: str = "base") -> ml_collections.ConfigDict:
    paper = teacher_preset not in recipes.SMALL_PRESETS
    teacher = bert_preset(teacher_preset)
    if teacher_preset == "base":
        sizes = dict(num_layers=4, hidden_size=312, num_heads=12, intermediate_size=1200)
    else:
        hidden = teacher["hidden_size"] // 2
        sizes = dict(num_layers=max(1, teacher["num_layers"] // 2), hidden_size=hidden,
                     num_heads=teacher["num_heads"], intermediate_size=4 * hidden)
    c = recipes.pretraining(sizes, family="tinybert", objective="tinybert", paper=paper)
    c.model.teacher_hidden_size = teacher["hidden_size"]
    c.data.update(instances="full_sentences", masking="dynamic", mask_prob=0.0, random_prob=0.0)
    if paper:
        c.total_steps = 100_000
        c.optimizer.update(learning_rate=5e-5, warmup_steps=10_000)
    return c
