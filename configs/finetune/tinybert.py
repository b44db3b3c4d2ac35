"""TinyBERT's task-specific distillation (prediction layer): a student learns a fine-tuned
teacher's predictions on a classification task.

    python -m bertology.finetune --config configs/finetune/embedded.py --workdir runs/teacher_ft \
        --config.init_checkpoint=runs/teacher
    python -m bertology.finetune --config configs/finetune/tinybert.py:embedded --workdir runs/tiny_ft \
        --config.init_checkpoint=runs/tinybert --config.teacher_checkpoint=runs/teacher_ft

The argument is the task. The student (here a TinyBERT general-distillation run, whose
`fit_dense` fine-tuning leaves out) minimises the soft cross-entropy against the teacher's
logits at temperature 1 (`families/tinybert/objective.py`, stage "prediction"); the labels are not read.
The reference's 3 prediction epochs at lr 3e-5, batch 32, follow its 10 epochs of intermediate-
layer distillation on augmented data, which this repository does not have (no augmentation).
"""

from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = ("embedded", "sst2")


def get_config(task: str = "embedded"):
    c = default_config(task)
    c.distill_temperature = 1.0
    if task == "embedded":  # the small-model recipe of configs/finetune/embedded.py
        c.epochs, c.data.max_seq_length, c.optimizer.learning_rate = 5, 64, 1e-3
    else:
        c.optimizer.learning_rate = 3e-5
    return c
