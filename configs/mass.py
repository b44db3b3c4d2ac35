"""MASS (Song et al. 2019) pretraining: masked sequence-to-sequence with one contiguous fragment.

    python -m bertology.pretrain --config configs/mass.py:tiny --workdir runs/mass_tiny

The encoder sees the sentence with a fragment of 50% of its tokens masked; the decoder sees the
fragment shifted right (the token before it first, MASS#19) at the fragment's original positions
(`decoder_positions`) and predicts it. The network is BART's (`family="bart"`): MASS's XLM-based
Transformer is post-LN with GELU, learned positions, a LayerNorm on the embeddings, a shared
token table and an output layer tied to it with a bias; positions count from 0 (no fairseq
offset).

Presets `tiny` and `base` (the README's 6+6 layers, d_model 1024, 8 heads, FFN 4096, dropout
0.1, Adam b1 0.9 b2 0.98, lr 1e-4). MASS schedules the learning rate by inverse square root,
which `bertology.train.optimizer` lacks: base decays linearly after 4000 warmup steps, a stated
deviation. `data.objective="mass"` (the transform and its keys are the data side's);
`max_target_length` is half the input, the fragment. tiny: L2/H128/2 heads, 128 tokens, the
shipped 8k byte-level BPE, the small recipe.
"""

import ml_collections

from bertology import recipes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.errors import UserError

# name: (num_layers, hidden_size, num_heads, intermediate_size)
SIZES = {"tiny": (2, 128, 2, 512), "base": (6, 1024, 8, 4096)}

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
    c.model.update(type_vocab_size=0, pooler=False, max_position_embeddings=length)  # XLM: LayerNorm eps 1e-12
    c.data.update(objective="mass", max_seq_length=length, max_target_length=length // 2,
                  add_mask=True)  # a <mask> token where the vocabulary has none
    if tiny:
        c.data.vocab = str(BYTE_BPE_VOCAB)
        return c
    c.optimizer.update(learning_rate=1e-4, warmup_steps=4000, b2=0.98)
    return c
