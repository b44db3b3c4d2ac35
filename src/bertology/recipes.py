"""What every pretraining config shares, so each `configs/<family>.py` states only how its
family differs (big_vision keeps such common pieces in a helper module the same way).

`pretraining(...)` returns BERT's recipe: the paper's (batch 256, AdamW lr 1e-4, 10k warmup, 1M
steps) for full-size presets, and for the small presets one that learns within minutes on a CPU.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from bertology.train.sharding import mesh_config
from bertology.train.trackers import logging_config

SMALL_PRESETS = ("tiny", "mini", "small", "medium")


def pretraining(sizes: dict, *, family: str, objective: str | dict, paper: bool) -> ml_collections.ConfigDict:
    """The common config; `sizes` are TransformerConfig fields (layers, hidden, heads, ...)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.objective = objective
    c.total_steps = 1_000_000 if paper else 600
    c.batch_size = 256 if paper else 32
    c.grad_accum_steps = 1
    # A run directory (pretraining, or `bertology.convert --from hf`) to start from: its model
    # block and parameters replace this config's; the optimizer starts fresh.
    c.init_checkpoint = placeholder(str)
    # A run directory (or HF import) holding a frozen teacher for distillation objectives
    # (bertology.train.teacher): loaded at every start and resume, never trained or checkpointed.
    c.teacher_checkpoint = placeholder(str)

    c.model = ml_collections.ConfigDict(dict(
        family=family,
        vocab_size=placeholder(int),  # None: taken from the tokenizer; set: must match it
        vocab_multiple=1,  # pad the token table to a multiple of this many rows (128: tensor-core/TPU-friendly shapes)
        max_position_embeddings=512,
        type_vocab_size=2,
        dropout_rate=0.1,
        attention_dropout_rate=0.1,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        dtype="float32",
        # xla | cudnn | splash | auto: the attention kernel (models/attention.py); cudnn and splash
        # take no attention dropout, so their recipes set attention_dropout_rate=0 (MosaicBERT's)
        attention_backend="xla",
        remat="none",
        norm_backward="autodiff",  # autodiff | written_out: LayerNorm's backward pass (models/transformer.py)
        scan_layers=False,  # one compiled layer (nn.scan): compile time and memory of deep stacks
        share_layers="none",  # none | all | attention | ffn (ALBERT's cross-layer sharing)
        activation="gelu",  # gelu (erf) | gelu_tanh
        **sizes,
    ))

    c.data = ml_collections.ConfigDict(dict(
        corpus=placeholder(str),  # a text file or directory; None: the embedded default corpus
        # instead of corpus, a mixture: ({"path": ..., "weight": ...}, ...), each row drawn from corpus i with
        # probability weight_i / sum of the weights (data/pipeline.py)
        corpora=(),
        text_column="text",  # a parquet, Arrow or save_to_disk corpus's text (Hugging Face datasets)
        vocab=placeholder(str),  # vocab.txt or sentencepiece .model; None: the shipped 8k WordPiece
        cache_dir=placeholder(str),  # where tokenized corpora are kept; None: ~/.cache/bertology/tfds
        # The data transform by name (data/transforms.py's `lookup`): shared ones there, e.g. causal (GPT); a family's
        # own in families/<name>/data.py, e.g. span_corruption (families/t5), unilm (families/unilm).
        objective="mlm",
        max_seq_length=128,
        max_predictions_per_seq=20,
        masked_lm_prob=0.15,
        mask_prob=0.8,  # of the chosen positions: [MASK] ...
        random_prob=0.1,  # ... a random token; the rest keep their token
        mask_unit="token",  # token | whole_word | ngram | span | entity (needs lexicon)
        lexicon=placeholder(str),  # mask_unit=entity (ERNIE): a file, one entry per line, or shipped: phrases (None) | entities
        word_segmenter=placeholder(str),  # jieba: Chinese words for whole-word masking (BERT-wwm-chinese); None: tokenizer's
        # pairs (two segments) | full_sentences (RoBERTa) | packed (several documents per row, no attention across
        # them) | sentence_pairs, doc_sentences (RoBERTa's input-format ablation)
        instances="pairs",
        sentence_task="nsp",  # for pairs: nsp (random next) | sop (swapped order)
        short_seq_prob=0.1,
        masking="static",  # static: dupe_factor precomputed masked copies; dynamic: fresh masks each batch
        dupe_factor=10,
        window_documents=2048,  # documents per stream window (data/pipeline.py): random next sentences come from within it
    ))

    c.optimizer = ml_collections.ConfigDict(dict(
        name="adamw",  # adamw | lamb
        learning_rate=1e-4 if paper else 1e-3,
        warmup_steps=10_000 if paper else 60,
        b1=0.9,
        b2=0.999,
        eps=1e-6,
        weight_decay=0.01,
        clip_norm=1.0,
        # The schedule's horizon; None: total_steps. A run with total_steps below it stops early on
        # the long run's schedule (a time-sliced job; a later run with total_steps raised resumes it).
        schedule_steps=placeholder(int),
    ))

    # Strategies (bertology.train.sharding.STRATEGIES): dp, fsdp, tp, fsdp_tp. tp on the default
    # (all, 1) mesh is plain data parallel; --config.mesh.shape='(4,2)' splits heads and MLP over 2.
    c.mesh = mesh_config(strategy="tp", shape=(-1, 1))

    c.log_every = 50 if paper else 20
    c.logging = logging_config()  # W&B and trackio beside metrics.jsonl and TensorBoard (train/trackers.py)
    c.eval_every = 10_000 if paper else 200
    c.eval_batches = 4
    c.checkpoint_every = 10_000 if paper else 200
    # also checkpoint after this many minutes (0: off; e.g. 30 on preemptible VMs); a float so 0.5 parses
    c.checkpoint_every_minutes = 0.0
    c.keep_checkpoints = 3
    c.max_nonfinite_steps = 5  # NaN/inf steps in a row (each skipped, not applied) before a run stops
    c.allow_config_change = ""  # comma-separated keys a resumed run may change, e.g. total_steps,optimizer.learning_rate
    return c
