"""Fine-tune GPT as Radford et al. 2018 do: configs/finetune/gpt.py:<task> (the embedded task by default).

    python -m bertology.pretrain --config configs/gpt.py:tiny --workdir runs/gpt_tiny
    python -m bertology.finetune --config configs/finetune/gpt.py:embedded \
        --config.init_checkpoint=runs/gpt_tiny --workdir runs/ft_gpt

Any task of the other configs/finetune files. The trunk is GPT's (`families/gpt`): the decoder
run causally, the head at each row's last real token (the final [SEP], GPT-1's `extract`). The
loss adds the auxiliary language-modelling term, L = L_task + 0.5·L_LM (§3.2, `lm_weight`). On a
paper task the paper's recipe (§4.1, openai/finetune-transformer-lm `train.py`): lr 6.25e-5,
batch 32, 3 epochs, linear decay after a warmup over 0.2% of the steps, Adam eps 1e-8, weight
decay 0.01, clipping at 1. On the embedded task the small-model rate, as the other configs. The
similarity tasks (STS-B, MRPC, QQP) read each pair in both orders and add the two final states
before the head (§3.3, `data.both_orders`).
With init_checkpoint the checkpoint brings its model; without, `model` is configs/gpt.py:tiny's.
"""

import pathlib

from bertology.sweep import load_config
from bertology.train.finetune import default_config

PRETRAINING = pathlib.Path(__file__).resolve().parent.parent / "gpt.py"

# The presets get_config takes; tests run each through validation.
PRESETS = ("embedded", "sst2", "stsb", "mrpc", "qqp")
SIMILARITY = ("stsb", "mrpc", "qqp")  # the paper's similarity tasks: each pair read in both orders (§3.3)


def get_config(task: str = "embedded"):
    c = default_config(task)
    c.model = load_config(PRETRAINING, "tiny").model  # configs/gpt.py's network
    c.lm_weight = 0.5
    c.data.both_orders = task in SIMILARITY
    if task == "embedded":
        c.epochs, c.data.max_seq_length, c.optimizer.learning_rate = 5, 64, 1e-3
    else:
        c.batch_size, c.epochs = 32, 3
        c.optimizer.update(learning_rate=6.25e-5, warmup_fraction=0.002, eps=1e-8, weight_decay=0.01, clip_norm=1.0)
    return c
