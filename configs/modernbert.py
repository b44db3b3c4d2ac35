"""ModernBERT pretraining (Warner et al. 2024, arXiv 2412.13663; github.com/AnswerDotAI/ModernBERT).

    python -m bertology.pretrain --config configs/modernbert.py:tiny --workdir runs/modernbert_tiny
    python -m bertology.pretrain --config configs/modernbert.py:base --config.data.vocab=VOCAB

The network (`bertology.families.modernbert`): pre-LN without biases, rotary positions (base
160000 in the global layers, 10000 in the local ones), GeGLU feed-forward blocks, every third
layer global and the others a 128-token sliding window (64 keys each side). The objective is
masked LM alone (no NSP), at the paper's 30% masking rate, on packed rows (the reference's
`sequence_packing`: whole documents back to back, each attending only within itself, its rotary
positions restarting: the paper's unpadded batches, `data.instances=packed`); no dropout
anywhere, as the released checkpoints' configs say (HF `attention_dropout`, `embedding_dropout`,
`mlp_dropout` all 0.0).

Presets:
- tiny: 3 layers (global, local, local), hidden 128, 2 heads, GeGLU width 256, a 32-token window
  over 128-token rows so the locality matters, and the small recipe (batch 32, lr 1e-3), so it
  learns on a CPU within minutes.
- base / large: the released shapes, transformers' `ModernBertConfig()` defaults and
  answerdotai/ModernBERT-large's config.json: 22 layers, hidden 768, 12 heads, GeGLU 1152 /
  28 layers, hidden 1024, 16 heads, GeGLU 2624; both 8192 positions and a 50368-token table (the
  OLMo BPE tokenizer's 50280 tokens padded to a multiple of 64). A vocabulary's size must equal
  model.vocab_size: pass one of that size, or set `--config.model.vocab_size` to your vocabulary's.
  The recipe is the paper's where the shared recipe can say it (1024-token rows of the main
  phase, 30% masking, peak lr 8e-4 base / 5e-4 large, weight decay 1e-5); its StableAdamW, warmup-
  stable-decay schedule, batch-size warmup and 8192-token context extension are not reproduced:
  the rest is the shared BERT recipe.
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError

# name: TransformerConfig fields of the shape
SIZES = {
    "tiny": dict(num_layers=3, hidden_size=128, num_heads=2, intermediate_size=256),
    "base": dict(num_layers=22, hidden_size=768, num_heads=12, intermediate_size=1152, vocab_size=50368),
    "large": dict(num_layers=28, hidden_size=1024, num_heads=16, intermediate_size=2624, vocab_size=50368),
}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)

# The architecture every preset has (the family fills it in and refuses anything else; stated so
# that a run's config.json reads as what it computes) and ModernBERT's attention settings.
ARCHITECTURE = dict(norm="pre", norm_kind="layernorm", embedding_norm=True, first_attention_norm=False, use_bias=False,
                    norm_bias=False, positions="rotary", type_vocab_size=0, activation="geglu", pooler=False)
ATTENTION = dict(rope_theta=160000.0, local_rope_theta=10000.0, local_attention=128, global_attn_every_n_layers=3,
                 max_position_embeddings=8192, layer_norm_eps=1e-5, scale_residual_init=True)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    paper = preset != "tiny"
    sizes = dict(SIZES[preset])
    vocab_size = sizes.pop("vocab_size", None)
    c = recipes.pretraining(sizes, family="modernbert", objective="roberta", paper=paper)
    c.model.update(ARCHITECTURE, **ATTENTION, dropout_rate=0.0, attention_dropout_rate=0.0)
    if not paper:
        c.model.update(max_position_embeddings=512, local_attention=32)
    if vocab_size is not None:
        c.model.vocab_size = vocab_size
    # 30% of the tokens predicted (the paper's rate): 39 of a 128-token row
    c.data.update(instances="packed", masking="dynamic", masked_lm_prob=0.3, max_predictions_per_seq=39)
    if paper:
        c.data.update(max_seq_length=1024, max_predictions_per_seq=308)
        c.optimizer.update(learning_rate=8e-4 if preset == "base" else 5e-4, weight_decay=1e-5)
    return c
