"""BERT pretraining (MLM + NSP), Devlin et al. 2019.

    python -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/bert_tiny
    python -m bertology.pretrain --config configs/bert.py:base --config.total_steps=1000

The argument is the preset (tiny, mini, small, medium, base, large). The small presets get a
recipe that shows learning within minutes on a CPU; base and large get the paper's (batch 256,
lr 1e-4, 10k warmup, 1M steps, AdamW with decay 0.01).
"""

import ml_collections
from ml_collections.config_dict import placeholder

from bertology.models.presets import bert_preset

# Maps each logical axis name to a mesh axis (or None: replicated). Data parallel over `data`,
# Megatron-style tensor parallel over `model` (heads and MLP hidden units).
RULES = [
    ("batch", "data"),
    ("length", None),
    ("vocab", None),
    ("embed", None),
    ("hidden", None),
    ("heads", "model"),
    ("kv", None),
    ("mlp", "model"),
]


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.objective = "bert"
    paper = preset in ("base", "large")
    c.total_steps = 1_000_000 if paper else 600
    c.batch_size = 256 if paper else 32
    c.grad_accum_steps = 1

    c.model = ml_collections.ConfigDict(dict(
        family="bert",
        vocab_size=placeholder(int),  # None: taken from the tokenizer; set: must match it
        max_position_embeddings=512,
        type_vocab_size=2,
        dropout_rate=0.1,
        attention_dropout_rate=0.1,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        dtype="float32",
        remat="none",
        **bert_preset(preset),
    ))

    c.data = ml_collections.ConfigDict(dict(
        corpus=placeholder(str),  # a text file or directory; None: the embedded default corpus
        vocab=placeholder(str),  # vocab.txt or sentencepiece .model; None: the shipped 8k WordPiece
        cache_dir=placeholder(str),  # where tokenized corpora are kept; None: ~/.cache/bertology/tfds
        max_seq_length=128,
        max_predictions_per_seq=20,
        masked_lm_prob=0.15,
        short_seq_prob=0.1,
        masking="static",  # static: dupe_factor precomputed masked copies; dynamic: fresh masks each batch
        dupe_factor=10,
    ))

    c.optimizer = ml_collections.ConfigDict(dict(
        name="adamw",
        learning_rate=1e-4 if paper else 1e-3,
        warmup_steps=10_000 if paper else 60,
        b1=0.9,
        b2=0.999,
        eps=1e-6,
        weight_decay=0.01,
        clip_norm=1.0,
    ))

    c.mesh = ml_collections.ConfigDict(dict(axes=("data", "model"), shape=(-1, 1), rules=RULES))

    c.log_every = 50 if paper else 20
    c.eval_every = 10_000 if paper else 200
    c.eval_batches = 4
    c.checkpoint_every = 10_000 if paper else 200
    c.keep_checkpoints = 3
    return c
