"""Fine-tune XLNet on a task: configs/finetune/xlnet.py:<task> (the embedded task by default).

    python -m bertology.pretrain --config configs/xlnet.py:tiny --workdir runs/xlnet_tiny
    python -m bertology.finetune --config configs/finetune/xlnet.py:embedded \
        --config.init_checkpoint=runs/xlnet_tiny --workdir runs/ft_xlnet

Any task of the other configs/finetune files (`embedded`, a GLUE task, `squad`, `conll`, `swag`).
Inputs take XLNet's layout, `a <sep> b <sep> <cls>` padded on the left (`data.cls_position`,
`data.padding_side`; `tasks/encode.py`), and the trunk is `xlnet.task_trunk`: the content stream
without memory, whose `pooled` is the summary of the last position (the `<cls>`). With
init_checkpoint the checkpoint brings its model; without, `model` is configs/xlnet.py:tiny's.
The rate is the small-model one on the embedded task (as configs/finetune/embedded.py), else the
XLNet paper's GLUE/SQuAD rate of 2e-5 (base) with BERT's schedule.
"""

import pathlib

from bertology.sweep import load_config
from bertology.train.finetune import default_config

PRETRAINING = pathlib.Path(__file__).resolve().parent.parent / "xlnet.py"

# The presets get_config takes; tests run each through validation.
PRESETS = ("embedded", "sst2")


def get_config(task: str = "embedded"):
    c = default_config(task)
    c.data.cls_position, c.data.padding_side = "last", "left"
    c.model = load_config(PRETRAINING, "tiny").model  # configs/xlnet.py's network
    if task == "embedded":
        c.epochs, c.data.max_seq_length, c.optimizer.learning_rate = 5, 64, 1e-3
    else:
        c.optimizer.learning_rate = 2e-5
    return c
