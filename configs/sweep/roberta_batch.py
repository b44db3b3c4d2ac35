"""RoBERTa's batch-size comparison (Liu et al. 2019, §5.3 and Table 3) in miniature: tiny BERT
pretrained on the embedded corpus with three batch sizes at equal rows seen (steps × batch, to a
rounded step: batch 512 gets 38 steps for 37.5) and so equal FLOPs, the learning rate raised with the batch by the paper's ratios, fine-tuned on the
embedded task, three seeds each, medians reported
(python -m bertology.sweep --config configs/sweep/roberta_batch.py --workdir runs/roberta_batch).

The paper: batch 256 for 1M steps at lr 1e-4, 2K for 125K at 7e-4, 8K for 31K at 1e-3 (the
batch × 8 and × 32, the rate × 7 and × 10), with MNLI-m 84.7 / 85.2 / 84.6 and SST-2 92.7 / 92.9 /
92.8: the larger batch is as good or better at the same rows seen (and easier to parallelise).
Here the batches are 16, 128 and 512 (× 8 and × 32), the smallest at 5e-4 (tiny BERT's 1e-3 is
for 32 rows) and the others at the paper's ratios, over 1200 × 16 rows (two of equal_flops.py's
budgets, almost three passes over the embedded corpus); each run warms up over its first 10% of
steps, as the sweep sets it.
"""

import pathlib

from bertology.sweep import load_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)
SMALLEST, RATE = 16, 5e-4
BATCHES = {"batch_16": (1, 1.0), "batch_128": (8, 7.0), "batch_512": (32, 10.0)}  # name: (× batch, × rate)


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("equal_flops.py"))  # its shapes and fine-tuning
    c.families = ()
    c.variants = tuple(dict(name=name, config="bert.py:tiny", overrides={
        "batch_size": SMALLEST * batch, "optimizer": {"learning_rate": RATE * rate}})
        for name, (batch, rate) in BATCHES.items())
    c.reference = "batch_16"
    c.reference_steps = 1200  # 1200 × 16 rows: 600 steps of equal_flops.py's 32
    c.budgets = (1.0,)
    c.seeds = (0, 1, 2)
    return c
