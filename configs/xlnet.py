"""XLNet (Yang et al. 2019) pretraining: permutation LM with two-stream attention and memory.

    python -m bertology.pretrain --config configs/xlnet.py:tiny --workdir runs/xlnet_tiny

Presets (zihangdai/xlnet README and `train.py` flags):
- large: 24 layers, d 1024, 16 heads of 64, d_inner 4096, seq 512 with reuse_len 256, mem_len 384,
  perm_size 256, num_predict 85, bi_data, relative biases per layer (untie_r), tanh-GELU,
  dropout 0.1 (attention too), batch 2048 (README's train_batch_size). The paper trains 500k
  steps with Adam and linear decay.
- base: the same at BERT-base's shape (12 layers, d 768, 12 heads, d_inner 3072).
- tiny: 2 layers of d 128 at seq 64 (reuse 32, mem 48, num_predict 11), batch 16, the shipped
  WordPiece vocabulary, so it learns on a CPU in minutes.

The full-size presets need XLNet's 32k sentencepiece model: `--config.data.vocab=spiece.model`.
The learning rate and warmup are the recipe's defaults: the published runs' values are not in
the reference facts this config was written from.

Evaluation (`eval`: mem_len, clamp_len; None = the training value) runs the trained parameters
with these settings over `model`, e.g. a longer memory than training's (`--config.eval.mem_len`);
XLNet has no `same_length`.

Data (`data.objective="xlnet"`): [reuse_len tokens | A <sep> B <sep> <cls>] over contiguous lanes,
span targets, `perm_mask` [B, L, L] (1 = may not attend) and `target_mapping` [B, P, L]; with
`bi_data` the second half of the batch holds the reversed copies (the model negates their
relative distances), so batch_size must be even.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from bertology import recipes
from bertology.errors import UserError
from bertology.models.presets import bert_preset

# BERT shape, sequence length, reuse_len, mem_len, num_predict
SHAPES = {"tiny": ("tiny", 64, 32, 48, 11), "base": ("base", 512, 256, 384, 85), "large": ("large", 512, 256, 384, 85)}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SHAPES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SHAPES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SHAPES)}")
    shape, length, reuse, memory, predict = SHAPES[preset]
    c = recipes.pretraining(bert_preset(shape), family="xlnet", objective="xlnet", paper=preset != "tiny")
    c.model.update(positions="none", type_vocab_size=0, embedding_norm=False, activation="gelu_tanh",
                   activation_dropout_rate=0.1, pooler=False, max_position_embeddings=length, mem_len=memory,
                   reuse_len=reuse, clamp_len=-1, untie_r=True, bi_data=True)
    c.eval = ml_collections.ConfigDict(dict(mem_len=placeholder(int), clamp_len=placeholder(int)))
    c.data.update(objective="xlnet", max_seq_length=length, reuse_len=reuse, num_predict=predict, bi_data=True,
                  perm_size=reuse)
    if preset == "tiny":
        c.batch_size = 16
    else:
        c.model.vocab_size = 32000
        c.batch_size = 2048
    return c
