"""Fine-tune on a GLUE task from its official TSVs: configs/finetune/glue.py:<task>.

    python -m bertology.finetune --config configs/finetune/glue.py:sst2 \
        --config.init_checkpoint=runs/tiny --config.data.dir=/data/glue/SST-2 --workdir runs/sst2

Tasks: cola, sst2, mrpc, qqp, stsb, mnli (scored on matched and mismatched), qnli, rte, wnli.
data.dir defaults to data/glue/<CoLA|SST-2|...>. BERT's recipe: lr in {5e-5, 3e-5, 2e-5}, batch
32, 3 epochs, length 128; small data sets (RTE, MRPC, STS-B, CoLA) are usually given more epochs.
"""

from bertology.errors import UserError
from bertology.tasks import glue
from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(glue.SPECS)


def get_config(task: str = "sst2"):
    if task not in glue.SPECS:
        raise UserError(f"unknown GLUE task {task!r}; use one of {', '.join(glue.SPECS)}")
    c = default_config(task)
    c.optimizer.learning_rate = 2e-5
    return c
