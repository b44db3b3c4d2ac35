"""GLUE's BiLSTM+ELMo+Attn baseline (Wang et al. 2018, §5) on a GLUE task: configs/finetune/glue_baseline.py:<task>.

    python -m bertology.finetune --config configs/finetune/glue_baseline.py:rte \
        --config.init_checkpoint=runs/elmo --config.data.dir=/data/glue/RTE --workdir runs/rte_bilstm

The trunk is frozen and read through ELMo's learned scalar mix (`mode=features`); the task model
is a two-layer BiLSTM of 1500 per direction with max pooling, attention between a pair's two
sentences and a second BiLSTM, and an MLP classifier with one hidden layer of 512
(`models/task_encoders.py`). Any run with a `features` mode can be the trunk (ELMo's is the
paper's). The optimizer is ours: Adam at 1e-3 without weight decay, 10% warm-up, since only the
task model trains. `task_encoder.name=bilstm` gives the baseline without attention.
"""

from bertology.errors import UserError
from bertology.tasks import glue
from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(glue.SPECS)


def get_config(task: str = "rte"):
    if task not in glue.SPECS:
        raise UserError(f"unknown GLUE task {task!r}; use one of {', '.join(glue.SPECS)}")
    c = default_config(task)
    c.mode = "features"
    c.task_encoder.update(name="bilstm_attn", hidden_size=1500, num_layers=2, classifier_hidden_size=512)
    c.optimizer.update(learning_rate=1e-3, weight_decay=0.0)
    return c
