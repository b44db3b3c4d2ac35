"""BigBird pretraining (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences", arXiv
2007.14062; github.com/google-research/bigbird).

    python -m bertology.pretrain --config configs/bigbird.py:tiny --workdir runs/bigbird_tiny
    python -m bertology.pretrain --config configs/bigbird.py:base --config.data.vocab=VOCAB

The network (`bertology.families.bigbird`): BERT's post-LN encoder whose self-attention is
block-sparse (`bertology.models.block_sparse`): blocks of `sparse_block_size` tokens, the first and
last global, the others seeing a 3-block window and `num_random_blocks` random blocks; the
tanh GELU of the released checkpoints (HF `hidden_act="gelu_new"`). The objective is RoBERTa's, as
the released bigbird-roberta checkpoints were trained: masked LM alone on full-sentence rows
with dynamic masking.

Presets:
- tiny: 2 layers, hidden 128, 2 heads, blocks of 8 tokens with 2 random blocks over 128-token
  rows (16 blocks: block-sparse, since rows longer than (5 + 2·2)·8 = 72 tokens are; shorter ones
  attend fully, as HF), and the small recipe (batch 32), so it learns on a CPU within minutes.
- base / large: the released shapes, transformers' `BigBirdConfig()` defaults
  (google/bigbird-roberta-base: 12 layers, hidden 768, 12 heads, 3072 feed-forward) and
  google/bigbird-roberta-large (24 layers, hidden 1024, 16 heads, 4096); both 4096 positions,
  blocks of 64 tokens with 3 random blocks, and a 50358-token sentencepiece table. A vocabulary's
  size must equal model.vocab_size: pass one of that size, or set `--config.model.vocab_size` to
  your vocabulary's. Rows are 4096 tokens (the released context); the rest is the shared
  BERT/RoBERTa recipe, not the paper's.
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError

# name: TransformerConfig fields of the shape
SIZES = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, vocab_size=50358),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096, vocab_size=50358),
}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)

# The layout every preset has (the family fills it in and refuses anything else; stated so that a
# run's config.json reads as what it computes) and the released attention settings.
ARCHITECTURE = dict(norm="post", norm_kind="layernorm", embedding_norm=True, positions="absolute", position_offset=0)
ATTENTION = dict(sparse_block_size=64, num_random_blocks=3, max_position_embeddings=4096, activation="gelu_tanh")


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    paper = preset != "tiny"
    sizes = dict(SIZES[preset])
    vocab_size = sizes.pop("vocab_size", None)
    c = recipes.pretraining(sizes, family="bigbird", objective="roberta", paper=paper)
    c.model.update(ARCHITECTURE, **ATTENTION)
    if not paper:
        c.model.update(max_position_embeddings=512, sparse_block_size=8, num_random_blocks=2)
    if vocab_size is not None:
        c.model.vocab_size = vocab_size
    c.data.update(instances="full_sentences", masking="dynamic")
    if paper:
        c.data.update(max_seq_length=4096, max_predictions_per_seq=615)  # 15% of 4096
    return c
