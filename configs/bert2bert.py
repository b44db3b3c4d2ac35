"""The BERT-as-encoder route (Rothe et al. 2020's BERT2RND): an encoder-decoder whose encoder is
a pretrained BERT and whose decoder (self-attention, cross-attention, feed-forward, own
positions and embedding norm) starts fresh; the token table, shared with the decoder and the
tied output layer, is BERT's too.

    python -m bertology.pretrain --config configs/bert2bert.py:tiny --workdir runs/bert2bert_tiny

The network is the `bart` family's encoder-decoder set to BERT's shapes and conventions
(post-LN, GELU, learned positions from 0, two segment types, LayerNorm eps 1e-12, no pooler),
so its `encoder/...` tree has BERT's names: `--config.init_checkpoint=DIR` with a BERT run or a
converted Hugging Face BERT of the same preset fills it (`bart.init_from`; the pooler and heads
are dropped) and the decoder starts fresh. The data here is
MASS's masked-fragment objective on the corpus, which BERT's WordPiece supports ([MASK], [SEP]
ends each block); seq2seq fine-tuning takes the same model block.

Presets: BERT's (tiny, mini, small, medium, base, large), the small recipe for the small ones.
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    paper = preset not in recipes.SMALL_PRESETS
    c = recipes.pretraining(bert_preset(preset), family="bart", objective="seq2seq", paper=paper)
    c.model.update(pooler=False)
    c.data.update(objective="mass", masking="dynamic", max_target_length=(c.data.max_seq_length + 1) // 2)
    return c
