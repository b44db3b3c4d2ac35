"""T5 (Raffel et al. 2020) and T5 v1.1 pretraining: span corruption with an encoder-decoder.

    python -m bertology.pretrain --config configs/t5.py:tiny --workdir runs/t5_tiny

Presets `tiny`, `small`, `base` (v1.0: ReLU feed-forward, output tied to the token table and
scaled by d_model**-0.5) and `v1_1_tiny`, `v1_1_small`, `v1_1_base` (gated tanh-GELU, untied
`lm_head`, no dropout in pretraining). Every preset: pre-LN RMSNorm (eps 1e-6), no biases, no
position table, relative position buckets (32, max distance 128), unscaled attention scores,
heads of 64 (`head_size`, T5's d_kv: v1.1-small has 6 heads on d_model 512), and Mesh
TensorFlow's fan-in initialisation (`init_scheme="fan_in"`: embeddings N(0, 1), each matrix
std 1/sqrt(fan-in), queries also x 1/sqrt(d_kv)), without which the unscaled scores and tied,
d_model**-0.5-scaled output start orders of magnitude too small to learn quickly.

- small: 6+6 layers, d_model 512, 8 heads, d_ff 2048; base: 12+12, 768, 12, 3072 (v1.0, about
  60M and 220M parameters). v1.1: small 8+8, 512, 6 heads, d_ff 1024; base 12+12, 768, 12, 2048.
- Data: `data.objective="span_corruption"` (noise density 0.15, mean span 3; the transform and
  its `data.noise.*` keys are the data side's); 512 input tokens whose targets hold at most 114
  (T5's `random_spans_helper`, text-to-text-transfer-transformer's preprocessors), 128 -> 29 for tiny. The vocabulary is `data.vocab`
  plus 100 sentinels (`data.extra_ids`): 32,100 on T5's 32k sentencepiece (Google's checkpoints
  pad the table to 32,128; an imported one keeps its rows), 8,100 on the shipped unigram for tiny.
- Recipe: batch 128 x 512, 2^19 steps, 10k warmup. The paper's Adafactor with an inverse
  square-root schedule has no counterpart in `bertology.train.optimizer` (AdamW and LAMB), so
  the full presets use AdamW at lr 1e-4 with linear decay, a stated deviation; tiny uses the
  small recipe (lr 1e-3, 60 warmup, 600 steps, batch 32).
"""

import pathlib

import ml_collections

import bertology
from bertology import recipes
from bertology.errors import UserError

UNIGRAM_VOCAB = pathlib.Path(bertology.__file__).parent / "data" / "assets" / "unigram_uncased_albert_8k.model"

# name: (num_layers, hidden_size, num_heads, intermediate_size)
SIZES = {
    "tiny": (2, 128, 2, 512),
    "small": (6, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "v1_1_tiny": (2, 128, 2, 512),
    "v1_1_small": (8, 512, 6, 1024),
    "v1_1_base": (12, 768, 12, 2048),
}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)
TARGET_LENGTH = {128: 29, 512: 114}  # span corruption's target length for an input length (`random_spans_helper`)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    layers, hidden, heads, ff = SIZES[preset]
    v1_1, small = preset.startswith("v1_1_"), preset.endswith("tiny")
    sizes = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=ff, head_size=64)
    c = recipes.pretraining(sizes, family="t5", objective="seq2seq", paper=not small)
    c.model.update(norm="pre", norm_kind="rmsnorm", use_bias=False, positions="relative_bias", type_vocab_size=0,
                   embedding_norm=False, scale_attention=False, layer_norm_eps=1e-6, pooler=False, init_scheme="fan_in",
                   relative_buckets=32, relative_max_distance=128,
                   activation="gated_gelu" if v1_1 else "relu", tie_embeddings=not v1_1)
    # T5 has one dropout rate, applied to the attention probabilities and the feed-forward hidden layer too
    rate = 0.0 if v1_1 else c.model.dropout_rate  # v1.1 turned dropout off in pretraining
    c.model.update(dropout_rate=rate, attention_dropout_rate=rate, activation_dropout_rate=rate)
    length = 128 if small else 512
    # T5's 100 sentinels <extra_id_k> sit on top of the vocabulary, <extra_id_0> last.
    c.data.update(objective="span_corruption", max_seq_length=length, max_target_length=TARGET_LENGTH[length],
                  extra_ids=100)
    if small:
        c.data.vocab = str(UNIGRAM_VOCAB)
        return c
    c.batch_size, c.total_steps = 128, 2 ** 19
    return c
