"""Fine-tune on SWAG from the official CSV files (train.csv, val.csv, optionally test.csv).

    python -m bertology.finetune --config configs/finetune/swag.py \
        --config.init_checkpoint=runs/tiny --config.data.dir=/data/swag --workdir runs/swag

Multiple choice over four endings, as in the BERT paper: lr 2e-5, batch 16, 3 epochs.
"""

from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = default_config("swag")
    c.batch_size = 16
    c.optimizer.learning_rate = 2e-5
    return c
