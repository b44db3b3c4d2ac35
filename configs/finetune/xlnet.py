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

import importlib.util
import pathlib

from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = ("embedded", "sst2")


def pretraining_config(preset: str):
    """configs/xlnet.py's config: the fine-tuning model is its network."""
    spec = importlib.util.spec_from_file_location("xlnet_config", pathlib.Path(__file__).parent.parent / "xlnet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset)


def get_config(task: str = "embedded"):
    c = default_config(task)
    c.data.cls_position, c.data.padding_side = "last", "left"
    c.model = pretraining_config("tiny").model
    if task == "embedded":
        c.epochs, c.data.max_seq_length, c.optimizer.learning_rate = 5, 64, 1e-3
    else:
        c.optimizer.learning_rate = 2e-5
    return c
