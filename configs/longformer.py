"""Longformer pretraining (Beltagy et al. 2020, arXiv 2004.05150; github.com/allenai/longformer).

    python -m bertology.pretrain --config configs/longformer.py:tiny --workdir runs/longformer_tiny
    python -m bertology.families.longformer.longify --from runs/roberta_base --to runs/longformer_base
    python -m bertology.pretrain --config configs/longformer.py:base --config.init_checkpoint=...

The network (`bertology.families.longformer`) is RoBERTa's with sliding-window attention in every
layer (`attention_window`, the window's total width) and global tokens with their own projections;
the objective is RoBERTa's masked LM on full-sentence rows with dynamic masking, its tokenizer
and Adam settings (configs/roberta.py).

Presets:
- tiny: RoBERTa-tiny's shape (2 layers, hidden 128, 2 heads) with a 32-token window over
  128-token rows, so the locality matters, and the small recipe: it learns on a CPU in minutes.
- base / large: allenai/longformer-base-4096 and -large-4096 as released: RoBERTa-base / -large
  (12L/768/12/3072, 24L/1024/16/4096), `attention_window` 512 in every layer, 4098 positions (4096
  after the padding slots), one segment type, a 50265-token table (pass a vocabulary of that size
  or set `--config.model.vocab_size`). The recipe is the paper's continued pretraining (§5, its
  appendix table of hyperparameters): 4096-token rows, batch 64, lr 3e-5, 500 warmup steps, 65k
  steps, started from a RoBERTa long-ified by `longify` (positions copied out to 4096, global
  projections copied from the local ones).
"""

import pathlib

import ml_collections

import bertology
from bertology import recipes
from bertology.errors import UserError
from bertology.models.presets import bert_preset

PRESETS = ("tiny", "base", "large")
BPE_VOCAB = pathlib.Path(bertology.__file__).parent / "data" / "assets" / "bpe_cased_roberta_8k.model"  # RoBERTa's


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    c = load_roberta(preset)
    c.model.family = "longformer"
    if preset == "tiny":
        c.model.update(attention_window=(32,), max_global_tokens=16)  # a tuple: --config.model.attention_window='(64,)'
        c.data.vocab = str(BPE_VOCAB)
        return c
    c.model.update(attention_window=(512,) * c.model.num_layers, max_global_tokens=16, max_position_embeddings=4098,
                   vocab_size=50265)
    c.data.update(max_seq_length=4096, max_predictions_per_seq=615)  # 15% of 4096
    c.batch_size, c.grad_accum_steps, c.total_steps = 64, 1, 65_000
    c.optimizer.update(learning_rate=3e-5, warmup_steps=500)
    return c


def load_roberta(preset: str) -> ml_collections.ConfigDict:
    """RoBERTa's config of the same size (configs/roberta.py), whose recipe Longformer continues."""
    paper = preset != "tiny"
    c = recipes.pretraining(bert_preset(preset), family="roberta", objective="roberta", paper=paper)
    c.model.update(type_vocab_size=1, position_offset=2, max_position_embeddings=514, layer_norm_eps=1e-5)
    c.data.update(instances="full_sentences", masking="dynamic")
    c.optimizer.update(b2=0.98, eps=1e-6, weight_decay=0.01)
    return c
