"""Seq2seq fine-tuning of a GPT2GPT run (Ramachandran, Liu & Le 2017, "Unsupervised Pretraining
for Sequence to Sequence Learning", with GPT stacks for the paper's LSTMs): the encoder starts as
a source-side GPT run, the decoder as a target-side one, the cross-attention fresh, and training
adds both language-model losses to the seq2seq loss (`families/gpt2gpt/objective.py`).

    python -m bertology.pretrain --config configs/gpt.py:tiny --workdir runs/gpt_source
    python -m bertology.pretrain --config configs/gpt.py:tiny --config.seed=1 --workdir runs/gpt_target
    python -m bertology.families.gpt2gpt.combine --source runs/gpt_source --target runs/gpt_target --to runs/gpt2gpt
    python -m bertology.finetune --config configs/gpt2gpt.py:embedded --config.init_checkpoint=runs/gpt2gpt \\
        --workdir runs/gpt2gpt_embedded

The argument is a task of configs/finetune/seq2seq.py (embedded, jsonl, cnndm, xsum) with its
lengths, decoding and recipe. `source_lm_weight` and `target_lm_weight` (1.0 each: the paper adds
the LM losses to the seq2seq loss) weigh the regularisers; 0 and 0 train the plain seq2seq loss.
The model block (tiny GPT's shapes, byte-level BPE) is used only without init_checkpoint: the
same network from scratch, the paper's no-pretraining baseline. `model.causal_encoder` (True: the
paper's encoder is a unidirectional LM; see `families/gpt2gpt/model.py`) is written by `combine`
(`--bidirectional_encoder`).
"""

import pathlib

import ml_collections

from bertology.sweep import load_config

CONFIGS = pathlib.Path(__file__).resolve().parent
TASKS = ("embedded", "jsonl", "cnndm", "xsum")

# The presets get_config takes; tests run each through validation.
PRESETS = TASKS


def get_config(task: str = "embedded") -> ml_collections.ConfigDict:
    c = load_config(CONFIGS / "finetune" / "seq2seq.py", task)
    gpt = load_config(CONFIGS / "gpt.py", "tiny")
    c.model = ml_collections.ConfigDict({**gpt.model.to_dict(), "family": "gpt2gpt", "causal_encoder": True})
    c.data.vocab = gpt.data.vocab
    c.data.max_seq_length = min(c.data.max_seq_length, gpt.data.max_seq_length)
    c.source_lm_weight = 1.0
    c.target_lm_weight = 1.0
    return c
