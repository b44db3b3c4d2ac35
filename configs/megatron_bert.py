"""Megatron-BERT pretraining (Shoeybi et al. 2019): BERT with pre-LN layers and a final LayerNorm.

    python -m bertology.pretrain --config configs/megatron_bert.py:tiny --workdir runs/megatron_bert_tiny
    python -m bertology.pretrain --config configs/megatron_bert.py:345m --config.data.vocab=VOCAB

Presets:
- tiny: BERT-tiny's shape (L2/H128/2 heads/FF512) and the small recipe (batch 32, lr 1e-3, 60
  warmup, 600 steps), so it learns on a CPU within minutes.
- 345m: the released checkpoint's shape, HF's `MegatronBertConfig()` defaults: 24 layers, hidden
  1024, 16 heads, FF 4096, 512 positions, 29056 tokens. 29056 is megatron-bert-cased-345m's table
  (BERT's 28996-token cased WordPiece padded to a multiple of 128, as Megatron-LM pads); the
  uncased checkpoint's is 30592 (30522 padded; transformers' convert_megatron_bert_checkpoint.py
  reads it from the checkpoint). A vocabulary's size must equal model.vocab_size: pass one of that
  size, or set `--config.model.vocab_size` to your vocabulary's (30522 for the paper's uncased BERT
  dictionary). The recipe is the paper's (section 5.3): batch 1024, Adam lr 1e-4
  warmed up over 10k steps and decayed linearly over 2M, otherwise BERT's (weight decay 0.01);
  length 512 as Megatron-LM's BERT example.

Every preset has the architecture (`model.norm="pre"`, `model.embedding_norm=False`; the family
refuses anything else) and Megatron-LM's data: the paper's sentence-order prediction instead of
NSP (Megatron-LM's "random next" swaps the segments; the head is HF's `seq_relationship`, so the
loss is logged as `nsp_loss`) and whole-word n-gram masking (n <= 3 words, p(n) ∝ 1/n, Megatron-LM's
`create_masked_lm_predictions` defaults, ALBERT's scheme). LayerNorm eps is HF's 1e-12 (what a
converted checkpoint's config.json says and HF computes; Megatron-LM's own default is 1e-5).
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError
from bertology.models.presets import bert_preset

# name: TransformerConfig fields of the shape
SIZES = {
    "tiny": bert_preset("tiny"),
    "345m": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096, vocab_size=29056),
}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    paper = preset != "tiny"
    sizes = dict(SIZES[preset])
    vocab_size = sizes.pop("vocab_size", None)
    c = recipes.pretraining(sizes, family="megatron_bert", objective="bert", paper=paper)
    c.model.update(norm="pre", embedding_norm=False)
    if vocab_size is not None:
        c.model.vocab_size = vocab_size
    c.data.update(sentence_task="sop", mask_unit="ngram")
    if paper:
        c.data.update(max_seq_length=512, max_predictions_per_seq=77)
        c.batch_size, c.total_steps = 1024, 2_000_000
        c.optimizer.update(learning_rate=1e-4, warmup_steps=10_000)
    return c
