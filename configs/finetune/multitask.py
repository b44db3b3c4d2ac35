"""Multi-task fine-tuning (`bertology.train.multitask`): one encoder, a head per task, configs/finetune/multitask.py:<preset>.

    python -m bertology.finetune --config configs/finetune/multitask.py:embedded --workdir runs/mt_embedded
    python -m bertology.finetune --config configs/finetune/multitask.py:glue --config.init_checkpoint=runs/base \
        --config.data.dir=... (or each task's --config.task_data.<task>.dir=/data/glue/<DIR>) --workdir runs/mtdnn
    python -m bertology.finetune --config configs/finetune/multitask.py:pals --config.init_checkpoint=runs/base ...
    # then each task alone from the multi-task encoder and its head (MT-DNN's last stage):
    python -m bertology.finetune --config configs/finetune/glue.py:rte --config.init_checkpoint=runs/mtdnn ...

- embedded: the two tasks that need no download, the embedded task (8 classes) and a short
  long-range task (the class word within 128 tokens), on the tiny BERT from scratch: a CPU run.
- glue: MT-DNN (Liu et al. 2019, §4.2) on the eight GLUE tasks it trains together (all but WNLI):
  Adamax at 5e-5, batch 32, 5 epochs, 10% warmup then linear decay, gradients clipped at 1, rows of
  up to 512 tokens, dropout 0.1 before each head but MNLI's 0.3 and CoLA's 0.05; batches drawn in
  proportion to the tasks' sizes. The paper names no weight decay: 0.
- pals: BERT and PALs (Stickland & Murray 2019) on the same tasks: PALs of width 204 with 12 heads,
  their projections shared across layers, annealed sampling, and the released run_multi_task.py's
  recipe: AdamW at 2e-5, batch 32, rows of 128 tokens, 60,000 steps in 25 "epochs" of 2,400.

Each GLUE task reads data/glue/<DIR> unless `task_data.<task>.dir` says otherwise.
"""

from bertology.errors import UserError
from bertology.train.multitask import default_config

PRESETS = ("embedded", "glue", "pals")
GLUE = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")


def get_config(preset: str = "embedded"):
    if preset not in PRESETS:
        raise UserError(f"unknown multi-task preset {preset!r}; use one of {', '.join(PRESETS)}")
    if preset == "embedded":
        c = default_config(("embedded", "long_range"))
        c.data.max_seq_length = 128
        c.data.update(long_range_tokens=120, long_range_prefix=16, long_range_train=500, long_range_eval=100,
                      long_range_classes=4, long_range_seed=0)
        c.epochs = 3
        c.optimizer.learning_rate = 1e-3
        return c
    c = default_config(GLUE)
    if preset == "glue":
        c.optimizer.update(name="adamax", learning_rate=5e-5, weight_decay=0.0)
        c.epochs = 5
        c.data.max_seq_length = 512
        c.head_dropout.update(mnli=0.3, cola=0.05)
        return c
    c.pals.update(size=204, heads=12, shared_projections=True)
    c.sampling = "annealed"
    c.optimizer.learning_rate = 2e-5
    c.total_steps, c.epochs = 60_000, 25
    return c
