"""ALBERT pretraining (Lan et al. 2020): factorized embeddings, shared layers, SOP, n-gram masking.

    python -m bertology.pretrain --config configs/albert.py:tiny --workdir runs/albert_tiny
    --config.model.share_layers=attention   # or ffn, none: the paper's sharing ablation

Presets tiny, base (12M), large (18M), xlarge (60M), xxlarge (235M) with a 30k vocab. The shipped
vocab for the embedded corpus is an 8k uncased sentencepiece unigram model with ALBERT's specials.
Full-size presets use LAMB (lr 0.00176, batch 4096, 125k steps, 3125 warmup) at length 512.
"""

import pathlib

import ml_collections

import bertology
from bertology import recipes
from bertology.models.presets import ALBERT_SIZES, factorized_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(ALBERT_SIZES)

UNIGRAM_VOCAB = pathlib.Path(bertology.__file__).parent / "data" / "assets" / "unigram_uncased_albert_8k.model"


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    paper = preset != "tiny"
    c = recipes.pretraining(factorized_preset(ALBERT_SIZES, preset), family="albert", objective="albert", paper=paper)
    c.model.update(share_layers="all", dropout_rate=0.0, attention_dropout_rate=0.0)
    c.data.update(sentence_task="sop", mask_unit="ngram", vocab=str(UNIGRAM_VOCAB))
    if paper:
        # The reference's pretraining flags (google-research/albert README, run_pretraining:
        # --max_seq_length=512 --max_predictions_per_seq=20) cap a full row at 20 of the
        # round(0.15 · 512) = 77 predictions the rate asks for: on purpose, so validation allows it.
        c.data.update(max_seq_length=512, max_predictions_per_seq=20, allow_capped_predictions=True)
        c.batch_size, c.total_steps = 4096, 125_000
        c.optimizer.update(name="lamb", learning_rate=0.00176, warmup_steps=3125)
    return c
