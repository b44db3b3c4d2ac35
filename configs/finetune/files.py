"""Fine-tune on your own files, no code: configs/finetune/files.py:<task>.

    python -m bertology.finetune --config configs/finetune/files.py:text_classification \
        --config.init_checkpoint=runs/tiny --config.data.files.train=stance/train.csv \
        --config.data.files.validation=stance/dev.csv --config.data.columns.text=tweet \
        --config.data.columns.pair=target --config.data.columns.label=stance --workdir runs/stance

Tasks: text_classification (a sentence or pair per row, any label set), text_regression (a number
per row) from .csv, .tsv or .jsonl files; token_tagging (a tag per word, any tag set) from
CoNLL-style column files (`data.columns.tag`: the tag's column, -1 the last). `data.labels`
("against,none,favor") fixes the classes and their order; unset, they are the training file's.
A test file (`data.files.test`) gets its predictions written to submission/test_predictions.tsv.
The file formats and their errors: `bertology.tasks.custom`.
"""

from bertology.errors import UserError
from bertology.tasks import custom
from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(custom.TASKS)


def get_config(task: str = "text_classification"):
    if task not in custom.TASKS:
        raise UserError(f"unknown task {task!r} for your own files; use one of {', '.join(custom.TASKS)}")
    return default_config(task)
