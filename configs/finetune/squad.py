"""Fine-tune on SQuAD from the official JSON files: configs/finetune/squad.py:v1 or :v2.

    python -m bertology.finetune --config configs/finetune/squad.py:v2 \
        --config.init_checkpoint=runs/tiny --config.data.dir=/data/squad --workdir runs/squad2

data.dir holds train-v1.1.json / dev-v1.1.json (or the v2.0 pair); default data/squad. BERT's
recipe: lr 3e-5 (v1.1) / 5e-5 (v2.0), batch 32, 2 epochs, length 384, doc_stride 128, queries of
at most 64 tokens, answers of at most 30, 20-best; v2.0 answers "" when the null score beats the
best span by more than data.null_score_threshold (tune it on dev).
"""

from bertology.errors import UserError
from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = ("v1", "v2")


def get_config(version: str = "v1"):
    if version not in ("v1", "v2"):
        raise UserError(f"unknown SQuAD version {version!r}; use squad.py:v1 or squad.py:v2")
    c = default_config(f"squad_{version}")
    c.epochs = 2
    c.data.max_seq_length = 384
    c.optimizer.learning_rate = 3e-5 if version == "v1" else 5e-5
    return c
