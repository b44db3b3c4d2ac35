"""Transformer-XL (Dai et al. 2019) pretraining: a causal LM over contiguous lanes with carried memory.

    python -m bertology.pretrain --config configs/transfo_xl.py:tiny --workdir runs/txl_tiny

Presets:
- base: the reference's WikiText-103 base (kimiyoung/transformer-xl `run_wt103_base.sh`):
  16 layers, d 410, 10 heads of 41, d_inner 2100, dropout 0.1, attention dropout 0.0, segments
  (tgt_len) of 150 tokens with mem_len 150, batch 60, Adam lr 2.5e-4 with a cosine schedule to 0
  and no warmup, 200k steps, gradient clipping 0.25. The reference evaluates with mem_len 640,
  clamp_len 400 and same_length, which this preset's `eval` block sets (and with tgt_len 64,
  which is not: held-out segments are `data.max_seq_length` long, as in training).
  Its adaptive softmax (cutoffs 20k/40k/200k over WT103's 267k words) is replaced by a full
  softmax tied to the token table (see families/transfo_xl/model.py); `--config.data.vocab` names the
  tokenizer, whose size sets vocab_size.
- tiny: 2 layers of d 128, 2 heads, segments of 64 with mem_len 64, the shipped 8k byte-level BPE,
  batch 16, so it learns on a CPU in minutes.

Evaluation (`eval`: mem_len, same_length, clamp_len; None = the training value) runs the trained
parameters with these settings over `model`, with its own memory carried across the held-out
segments; `python -c "from bertology.train.loop import evaluate; ..."` (`evaluate(config,
workdir)`) re-evaluates a run's latest checkpoint with other ones, e.g. `--config.eval.mem_len=256`.

The data are the corpus as one token stream cut into `batch_size` lanes (`data.objective`, a
transform with `contiguous = True`): row b of step t+1 continues row b of step t, which the
memory relies on.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from bertology import recipes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.errors import UserError

# num_layers, hidden_size, num_heads, intermediate_size, segment length = mem_len
SHAPES = {"tiny": (2, 128, 2, 512, 64), "base": (16, 410, 10, 2100, 150)}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SHAPES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SHAPES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SHAPES)}")
    layers, hidden, heads, inner, length = SHAPES[preset]
    sizes = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=inner)
    c = recipes.pretraining(sizes, family="transfo_xl", objective="transfo_xl", paper=preset == "base")
    # the network in TransformerConfig terms: no absolute positions or segment table, embeddings
    # scaled by sqrt(d) without a norm, post-LN ReLU blocks whose MLP also drops after the ReLU
    c.model.update(positions="none", type_vocab_size=0, embedding_norm=False, scale_embeddings=True, activation="relu",
                   activation_dropout_rate=0.1, layer_norm_eps=1e-5, pooler=False, mem_len=length, clamp_len=-1,
                   same_length=False, untie_r=True)
    c.model.max_position_embeddings = length  # unused (relative positions); kept equal to the segment
    c.eval = ml_collections.ConfigDict(dict(mem_len=placeholder(int), same_length=placeholder(bool),
                                            clamp_len=placeholder(int)))
    c.data.update(objective="contiguous_lm", max_seq_length=length, vocab=str(BYTE_BPE_VOCAB))
    c.optimizer.update(schedule="cosine", end_learning_rate_fraction=0.0, weight_decay=0.0)
    if preset == "base":
        c.model.attention_dropout_rate = 0.0
        c.data.vocab = None
        c.batch_size, c.total_steps = 60, 200_000
        c.optimizer.update(name="adamw", learning_rate=2.5e-4, warmup_steps=0, clip_norm=0.25, eps=1e-8)
        c.eval.update(mem_len=640, clamp_len=400, same_length=True)
    else:
        c.batch_size = 16
    return c
