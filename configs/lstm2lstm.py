"""Seq2seq fine-tuning of an LSTM2LSTM run (Ramachandran, Liu & Le 2017, "Unsupervised Pretraining
for Sequence to Sequence Learning", the paper's LSTM version): the encoder's lower layers start as
a source-side LSTM LM run, the decoder's and its softmax as a target-side one, the layers above and
the attention fresh, and training adds both language-model losses to the seq2seq loss
(`families/gpt2gpt/objective.py`, shared with GPT2GPT).

    python -m bertology.pretrain --config configs/lstm_lm.py:tiny --config.model.n_layers=1 --workdir runs/lm_source
    python -m bertology.pretrain --config configs/lstm_lm.py:tiny --config.model.n_layers=1 --config.seed=1 \\
        --workdir runs/lm_target
    python -m bertology.families.lstm2lstm.combine --source runs/lm_source --target runs/lm_target --to runs/lstm2lstm
    python -m bertology.finetune --config configs/lstm2lstm.py:embedded --config.init_checkpoint=runs/lstm2lstm \\
        --workdir runs/lstm2lstm_embedded

The argument is a task of configs/gpt2gpt.py, whose fine-tuning this is but for the model:
configs/finetune/seq2seq.py's tasks (embedded, jsonl, cnndm, xsum) with their lengths, decoding
and recipe; `source_lm_weight` and `target_lm_weight` (1.0 each: the paper weighs the three losses
equally) weigh the regularisers, 0 and 0 train the plain seq2seq loss. The model block (the tiny
LSTM LM's cells, 256 projected to 64, and its 4k-word vocabulary; one LM layer, as the paper's
LMs, and one fresh layer on each side) is used only without init_checkpoint: the same network from
scratch, the paper's no-pretraining baseline. It is the block `combine` writes for two
`configs/lstm_lm.py:tiny --config.model.n_layers=1` runs.
"""

import pathlib

import ml_collections

from bertology.sweep import load_config

CONFIGS = pathlib.Path(__file__).resolve().parent
TASKS = ("embedded", "jsonl", "cnndm", "xsum")

# The presets get_config takes; tests run each through validation.
PRESETS = TASKS


def get_config(task: str = "embedded") -> ml_collections.ConfigDict:
    c = load_config(CONFIGS / "gpt2gpt.py", task)  # the task's recipe and the paper's LM weights
    lm = load_config(CONFIGS / "lstm_lm.py", "tiny")
    block = {k: v for k, v in lm.model.to_dict().items() if k != "kind"}
    c.model = ml_collections.ConfigDict({**block, "family": "lstm2lstm", "lm_layers": 1, "n_layers": 2})
    c.data.vocab = lm.data.vocab
    return c
