"""GPT (Radford et al. 2018) and GPT-2 (Radford et al. 2019) pretraining: a causal LM.

    python -m bertology.pretrain --config configs/gpt.py:tiny --workdir runs/gpt_tiny
    python -m bertology.generate --checkpoint runs/gpt_tiny --prompt "Return the"

Presets tiny, gpt1, gpt2 (124M), gpt2_medium (350M). Every preset has no segment table, no
LayerNorm on the embeddings, the tanh GELU (what OpenAI's code computes; HF calls it "gelu" for
openai-gpt and "gelu_new" for GPT-2), LayerNorm eps 1e-5, Adam eps 1e-8, and a cosine schedule.

- gpt1: post-LN 12L/768/12, context 512, learned positions, 40478 tokens (40k BPE merges + base
  symbols); Adam lr 2.5e-4, 2000 warmup steps then cosine to 0, batch 64 x 512, dropout 0.1,
  decoupled weight decay 0.01 on matrices (openai/finetune-transformer-lm `opt.py`). The paper
  gives 100 epochs of BooksCorpus, not a step count; total_steps stays the recipe's 1M.
- gpt2: pre-LN with a final norm, residual projections initialised x 1/sqrt(2 layers), context
  1024, 50257 tokens. GPT-2's optimizer was never published; this is the recipe that reproduces
  it (nanoGPT `config/train_gpt2.py`, GPT-3 Table 2.1 for 125M): AdamW b2 0.95, weight decay 0.1,
  lr 6e-4, 2000 warmup, cosine to 10% of the peak, clip 1.0, 512 x 1024 tokens per step,
  600k steps. gpt2_medium: 24L/1024/16 at GPT-3's lr for that shape, 3e-4.
- tiny: gpt2 at L2/H128/2 heads, context 128, the shipped 8k byte-level BPE, and the small
  recipe's lr 1e-3, 60 warmup, 600 steps, batch 32, so it learns on a CPU in about a minute.

The full-size presets need their tokenizer: `--config.data.vocab=DIR` with GPT-2's vocab.json
and merges.txt (gpt2). A vocab of another size stops with a vocab mismatch.
"""

import ml_collections

from bertology import recipes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.errors import UserError
from bertology.models.presets import bert_preset

# Each preset's shape is a BERT preset's: GPT-1 and GPT-2 are BERT-base's, GPT-2 medium BERT-large's.
SHAPES = {"tiny": "tiny", "gpt1": "base", "gpt2": "base", "gpt2_medium": "large"}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SHAPES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SHAPES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SHAPES)}")
    c = recipes.pretraining(bert_preset(SHAPES[preset]), family="gpt", objective="causal_lm", paper=preset != "tiny")
    c.model.update(type_vocab_size=0, embedding_norm=False, activation="gelu_tanh", layer_norm_eps=1e-5, pooler=False)
    c.data.update(objective="causal")
    # schedule: linear warmup to the peak, then cosine decay to end_learning_rate_fraction x peak at total_steps.
    c.optimizer.update(schedule="cosine", end_learning_rate_fraction=0.0, eps=1e-8)
    if preset == "gpt1":
        c.model.update(vocab_size=40478, max_position_embeddings=512)
        c.data.max_seq_length = 512
        c.batch_size = 64
        c.optimizer.update(learning_rate=2.5e-4, warmup_steps=2000, b2=0.999, weight_decay=0.01)
        return c
    c.model.update(norm="pre", scale_residual_init=True)
    c.optimizer.update(b2=0.95, weight_decay=0.1, end_learning_rate_fraction=0.1, clip_norm=1.0)
    if preset == "tiny":
        c.model.max_position_embeddings = 128
        c.data.update(max_seq_length=128, vocab=str(BYTE_BPE_VOCAB))
        return c
    c.model.update(vocab_size=50257, max_position_embeddings=1024)
    c.data.max_seq_length = 1024
    c.batch_size, c.total_steps = 512, 600_000
    c.optimizer.update(learning_rate=3e-4 if preset == "gpt2_medium" else 6e-4, warmup_steps=2000)
    return c
