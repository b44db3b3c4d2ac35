"""Fine-tune on the embedded task (which stdlib package a docstring sentence is from; no download).

    python -m bertology.finetune --config configs/finetune/embedded.py --workdir runs/ft_embedded
    python -m bertology.finetune --config configs/finetune/embedded.py --config.init_checkpoint=runs/tiny ...

From scratch it trains the tiny BERT of `model`; with init_checkpoint, the checkpoint's encoder.
The rate is the small-model one (tiny encoders want ~1e-3 rather than BERT-base's 2e-5..5e-5).
"""

from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = default_config("embedded")
    c.epochs = 5
    c.data.max_seq_length = 64
    c.optimizer.learning_rate = 1e-3
    return c
