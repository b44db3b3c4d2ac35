"""Fine-tune an encoder-decoder (BART, T5, MASS) on a source -> target task; scored by generation
with ROUGE-1/2/L/Lsum and BLEU.

    python -m bertology.finetune --config configs/finetune/seq2seq.py:embedded --workdir runs/s2s_bart
    python -m bertology.finetune --config configs/finetune/seq2seq.py:embedded_t5 --workdir runs/s2s_t5
    python -m bertology.finetune --config configs/finetune/seq2seq.py:embedded --config.init_checkpoint=runs/bart_tiny ...
    python -m bertology.finetune --config configs/finetune/seq2seq.py:cnndm --config.data.dir=/data/cnndm \\
        --config.init_checkpoint=runs/bart_base --workdir runs/cnndm

The argument is `<task>[_<family>]`: task `embedded` (a stdlib docstring's body -> its first
sentence; no download), `jsonl` (`{"source","target"}` lines), `cnndm` or `xsum` (their released
files, see bertology/tasks/seq2seq.py); family `bart` (default), `t5` or `unilm`, the tiny model
trained from scratch when no init_checkpoint is given (a checkpoint brings its own model, vocabulary and
decoder start). Recipe: AdamW, 10% warmup, linear decay, label smoothing 0.1 (BART's fine-tuning
default); evaluation decodes the first `eval_examples` of the validation split with
`generation.num_beams` beams (CNN/DailyMail: 4 beams, length penalty 2.0; XSum: 6 and 1.0, the
BART paper's settings). UniLM (`embedded_unilm`, or a UniLM run as init_checkpoint) fine-tunes as
its paper does: `[CLS] source [SEP] target [SEP]` under the sequence-to-sequence mask, the MLM
loss on `data.target_mask_prob` = 0.7 of the target tokens (unilm-v1's `--mask_prob`), no label
smoothing.
"""

import pathlib

import ml_collections

from bertology.errors import UserError
from bertology.sweep import load_config
from bertology.train.finetune import default_config

TASKS = {"embedded": "seq2seq_embedded", "jsonl": "seq2seq_jsonl", "cnndm": "cnndm", "xsum": "xsum"}
FAMILIES = ("bart", "t5", "unilm")
# task: (source length, target length, beams, length penalty)
SHAPES = {"embedded": (128, 48, 1, 1.0), "jsonl": (128, 64, 4, 1.0), "cnndm": (512, 128, 4, 2.0),
          "xsum": (512, 64, 6, 1.0)}

# The presets get_config takes; tests run each through validation.
# A bare <task> is <task>_bart.
PRESETS = tuple(task + (f"_{family}" if family != "bart" else "") for task in TASKS for family in FAMILIES)


def get_config(arg: str = "embedded") -> ml_collections.ConfigDict:
    task, _, family = arg.partition("_")
    family = family or "bart"
    if task not in TASKS or family not in FAMILIES:
        raise UserError(f"unknown preset {arg!r}; use <task>[_<family>] with task one of {', '.join(TASKS)} and "
                        f"family one of {', '.join(FAMILIES)}")
    source, target, beams, penalty = SHAPES[task]
    pre = load_config(pathlib.Path(__file__).resolve().parent.parent / f"{family}.py", "tiny")
    c = default_config(TASKS[task])
    c.model = pre.model
    c.data.vocab = pre.data.vocab
    c.data.max_seq_length = min(source, pre.data.max_seq_length)
    c.data.max_target_length = target
    c.label_smoothing = 0.1
    if family == "unilm":
        c.data.target_mask_prob = 0.7
    c.eval_examples = 200  # validation rows decoded at each evaluation (0: all)
    c.generation = ml_collections.ConfigDict(dict(num_beams=beams, length_penalty=penalty, max_new_tokens=target))
    c.epochs = 3
    c.batch_size = 32
    c.optimizer.learning_rate = 1e-3
    return c
