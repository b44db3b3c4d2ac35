"""ELECTRA's efficiency ablation (Clark et al. 2020; the seeds' deck 003) in miniature:
BERT, ELECTRA 15%, Replace MLM, All-Tokens MLM and ELECTRA, tiny, at equal pretraining FLOPs on
the embedded corpus, each fine-tuned on the embedded task, three seeds each, medians reported
(python -m bertology.sweep --config configs/sweep/electra_efficiency.py --workdir runs/electra_eff).

The paper's GLUE scores, for the ordering to look for: ELECTRA 85.0, All-Tokens MLM 84.3,
Replace MLM 82.4, ELECTRA 15% 82.4, BERT 82.2. At this size and budget the differences between
neighbours are within the seeds' spread; the table gives that spread.
"""

import pathlib

from bertology.sweep import load_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("equal_flops.py"))  # its shapes, budget unit and fine-tuning
    c.families = ("bert",)
    c.variants = tuple(dict(name=name, config=f"electra.py:{arg}") for name, arg in (
        ("electra_15", "tiny_15"), ("replace_mlm", "tiny_replace_mlm"), ("all_tokens_mlm", "tiny_all_tokens_mlm"),
        ("electra", "tiny")))
    c.budgets = (1.0,)
    c.seeds = (0, 1, 2)
    return c
