"""ULMFiT's fine-tuning recipe (Howard & Ruder 2018) on any layered trunk: configs/finetune/ulmfit.py:<task>.

    python -m bertology.finetune --config configs/finetune/ulmfit.py:sst2 \
        --config.init_checkpoint=runs/gpt_tiny --config.data.dir=/data/glue/SST-2 --workdir runs/sst2_ulmfit

The three parts of its recipe: discriminative fine-tuning (each layer's rate 1/2.6 of the one
above: `optimizer.layerwise_lr_decay`), the slanted triangular rate (10% of the steps rising from
1/32 of the peak, the rest falling back to it), and gradual unfreezing (the head alone in the
first epoch, then one more layer, top down, each epoch); Adam with β = (0.7, 0.99). The paper's
peak rate, 0.01, was for its AWD-LSTM; a Transformer trunk keeps the task's usual rate here
(`embedded`: the tiny encoders' 1e-3; GLUE: BERT's 2e-5..5e-5), and the epochs are at least as
many as the layer groups, so every layer trains. An LSTM trunk has no layer index and is refused.
"""

from bertology.errors import UserError
from bertology.tasks import glue
from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = ("embedded", *glue.SPECS)


def get_config(task: str = "embedded"):
    if task not in PRESETS:
        raise UserError(f"unknown task {task!r} for the ULMFiT recipe; use one of {', '.join(PRESETS)}")
    c = default_config(task)
    c.optimizer.update(dict(layerwise_lr_decay=1 / 2.6, schedule="slanted_triangular", stlr_ratio=32.0,
                            warmup_fraction=0.1, b1=0.7, b2=0.99))
    c.unfreeze_every_epochs = 1.0
    if task == "embedded":
        c.data.max_seq_length = 64
        c.optimizer.learning_rate = 1e-3
        c.epochs = 6
    else:
        c.optimizer.learning_rate = 3e-5
        c.epochs = 15  # head, 12 layers and the embeddings of a base model each get their epochs
    return c
