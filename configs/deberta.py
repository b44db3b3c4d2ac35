"""DeBERTa-v3 pretraining (He et al. 2023, "DeBERTaV3", arXiv 2111.09543; DeBERTa: He et al. 2021,
arXiv 2006.03654; github.com/microsoft/DeBERTa).

    python -m bertology.pretrain --config configs/deberta.py:tiny --workdir runs/deberta_tiny
    python -m bertology.pretrain --config configs/deberta.py:base --config.data.vocab=VOCAB

The network (`bertology.families.deberta`, HF `deberta-v2`): a post-LN encoder without position
or segment tables, positions entering through disentangled attention (content-to-position and
position-to-content terms over log-bucketed relative positions, one shared LayerNorm'd relative
table).

    python -m bertology.pretrain --config configs/deberta.py:tiny_rtd --workdir runs/deberta_tiny_rtd

Objectives: `<size>` is masked LM (the RoBERTa objective: full-sentence rows, dynamic 15%
masking), the network HF's `DebertaV2ForMaskedLM` holds. `<size>_rtd` is DeBERTa-v3's own:
ELECTRA's replaced-token detection (the `electra` objective, discriminator weight 50, ELECTRA's
85% [MASK] / 15% kept masking) with a generator as wide as the discriminator and half as deep, and
gradient-disentangled embedding sharing (GDES: the discriminator's token table is
stop_gradient(the generator's) + its own zero-initialised delta), `model.pretraining="rtd"`.

Presets:
- tiny: 2 layers, hidden 128, 2 heads, FFN 256, 32 relative buckets up to distance 128 on
  128-token rows, the small recipe (batch 32), so it learns on a CPU within minutes.
- base / large: the released microsoft/deberta-v3-base and -large shapes (the paper's Table 2
  models): 12 layers, hidden 768, 12 heads, FFN 3072 / 24 layers, hidden 1024, 16 heads, FFN 4096;
  both a 128100-token table (the 128K SentencePiece vocabulary), 256 position buckets,
  max_relative_positions -1 (so 512, max_position_embeddings), LayerNorm eps 1e-7, GELU, dropout
  0.1. A vocabulary's size must equal model.vocab_size: pass one of that size, or set
  `--config.model.vocab_size`. The recipe is the shared BERT recipe, not the paper's.
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError

# name: TransformerConfig fields of the shape (and the relative settings)
SIZES = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=256),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, vocab_size=128100),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096, vocab_size=128100),
}

# The presets get_config takes; tests run each through validation.
PRESETS = (*SIZES, *(f"{size}_rtd" for size in SIZES))

# The architecture every preset has (the family fills it in and refuses anything else; stated so
# that a run's config.json reads as what it computes).
ARCHITECTURE = dict(norm="post", norm_kind="layernorm", embedding_norm=True, use_bias=True, positions="none",
                    type_vocab_size=0, pooler=False)
# DeBERTa-v3's relative attention (HF DebertaV2Config of microsoft/deberta-v3-base)
RELATIVE = dict(position_buckets=256, max_relative_positions=-1, max_position_embeddings=512, layer_norm_eps=1e-7)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    preset, _, rtd = preset.partition("_")
    paper = preset != "tiny"
    sizes = dict(SIZES[preset])
    vocab_size = sizes.pop("vocab_size", None)
    objective: str | ml_collections.ConfigDict = "roberta"
    if rtd:
        objective = ml_collections.ConfigDict(dict(name="electra", disc_weight=50.0, variant="electra"))
    c = recipes.pretraining(sizes, family="deberta", objective=objective, paper=paper)
    c.model.update(ARCHITECTURE, **RELATIVE)
    if not paper:
        c.model.update(position_buckets=32, max_relative_positions=128)
    if vocab_size is not None:
        c.model.vocab_size = vocab_size
    c.data.update(instances="full_sentences", masking="dynamic")
    if rtd:
        c.model.update(pretraining="rtd", embedding_sharing="gdes", generator_fraction=1.0,
                       generator_layers=max(c.model.num_layers // 2, 1), discriminator_head="rtd")
        c.data.update(mask_prob=0.85, random_prob=0.0)
    return c
