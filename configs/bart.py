"""BART (Lewis et al. 2020) pretraining: a denoising encoder-decoder that reconstructs the document.

    python -m bertology.pretrain --config configs/bart.py:tiny --workdir runs/bart_tiny

Presets `tiny`, `base` (6+6 layers, d_model 768, 12 heads, FFN 3072, about 140M parameters) and
`large` (12+12, 1024, 16 heads, FFN 4096, about 400M). Every preset: post-LN, GELU (erf),
LayerNorm (eps 1e-5) on each stack's embeddings, learned positions counted from 2 (fairseq's
offset: the table has max_seq_length + 2 rows), no sqrt(d) embedding scaling
(`no_scale_embedding=True`), one token table shared by both stacks and the output layer, plus an
output bias; the decoder starts from the end-of-sequence id.

- Data: `data.objective="bart"` (text infilling with Poisson(3) spans over 30% of the words and
  sentence permutation; the transform and its `data.noise.*` keys are the data side's); the
  target is the whole original document, so `max_target_length` equals `max_seq_length`.
- Recipe (fairseq's published command, FS#1899, and the paper): 512 tokens, batch 8000,
  500k steps, Adam b2 0.98, eps 1e-6, lr 4e-4 with 10k warmup and linear (polynomial) decay,
  weight decay 0.01, clip 0.1, dropout 0.1 (activation dropout 0); vocab 50265 (GPT-2's BPE).
- tiny: L2/H128/2 heads, FFN 512, 128 tokens, the shipped 8k byte-level BPE, and the small
  recipe (lr 1e-3, 60 warmup, 600 steps, batch 32).
"""

import ml_collections

from bertology import recipes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.errors import UserError

# name: (num_layers, hidden_size, num_heads, intermediate_size)
SIZES = {"tiny": (2, 128, 2, 512), "base": (6, 768, 12, 3072), "large": (12, 1024, 16, 4096)}
POSITION_OFFSET = 2

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    layers, hidden, heads, ff = SIZES[preset]
    tiny = preset == "tiny"
    sizes = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=ff)
    c = recipes.pretraining(sizes, family="bart", objective="seq2seq", paper=not tiny)
    length = 128 if tiny else 512
    c.model.update(type_vocab_size=0, layer_norm_eps=1e-5, pooler=False, position_offset=POSITION_OFFSET,
                   max_position_embeddings=length + POSITION_OFFSET)
    c.data.update(objective="bart", max_seq_length=length, max_target_length=length,
                  add_mask=True)  # a <mask> token where the vocabulary has none
    if tiny:
        c.data.vocab = str(BYTE_BPE_VOCAB)
        return c
    c.model.vocab_size = 50265
    c.batch_size, c.total_steps = 8000, 500_000
    c.optimizer.update(learning_rate=4e-4, warmup_steps=10_000, b2=0.98, eps=1e-6, weight_decay=0.01, clip_norm=0.1)
    return c
