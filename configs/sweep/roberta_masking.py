"""RoBERTa's static-against-dynamic masking comparison (Liu et al. 2019, §4.1 and Table 1) in
miniature: tiny BERT (SEGMENT-PAIR rows with NSP, as the paper's reimplementation of BERT)
pretrained on the embedded corpus at equal steps with each masking, fine-tuned on the embedded
task, three seeds each, medians reported
(python -m bertology.sweep --config configs/sweep/roberta_masking.py --workdir runs/roberta_masking).

The budget is three of equal_flops.py's (900 steps of 32 rows of 64 tokens), a little over four
passes over the embedded corpus, so that static masking repeats its masks as the paper's did:
- `bert`: static, BERT's `dupe_factor=10` differently masked copies; four passes use four of
  them, so each row is seen with a different mask every pass;
- `static_1`: static with a single copy: every pass sees each row with the same mask, four times
  (the paper's static row: 10 copies over 40 epochs, each mask seen 4 times);
- `dynamic`: a fresh mask for every batch (RoBERTa).
The paper's numbers, for the order to look for (SQuAD 2.0 / MNLI-m / SST-2): static 78.3 / 84.3 /
92.5, dynamic 78.7 / 84.0 / 92.9: dynamic comparable or slightly better, kept for its efficiency.
"""

import pathlib

from bertology.sweep import load_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("equal_flops.py"))  # its shapes, budget unit and fine-tuning
    c.families = ("bert",)
    c.variants = (
        dict(name="static_1", config="bert.py:tiny", overrides={"data": {"masking": "static", "dupe_factor": 1}}),
        dict(name="dynamic", config="bert.py:tiny", overrides={"data": {"masking": "dynamic"}}),
    )
    c.budgets = (3.0,)
    c.seeds = (0, 1, 2)
    return c
