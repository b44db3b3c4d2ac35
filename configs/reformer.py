"""Reformer pretraining (Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer",
arXiv 2001.04451; github.com/google/trax `trax/models/reformer`).

    python -m bertology.pretrain --config configs/reformer.py:tiny --workdir runs/reformer_tiny
    python -m bertology.pretrain --config configs/reformer.py:tiny_mlm --workdir runs/reformer_mlm

The network (`bertology.families.reformer`): reversible pre-LN layers whose self-attention is
shared-QK LSH attention or chunked local attention (`model.attn_layers`), axial position
embeddings, ReLU feed-forward blocks, and an untied LM head over the two concatenated streams.
The paper trains language models (enwik8, imagenet64): the causal LM (`is_decoder=True`, HF's
`ReformerModelWithLMHead`) is the default objective; `tiny_mlm` is the bidirectional masked LM of
HF's `ReformerForMaskedLM` under the shared MLM objective (RoBERTa's: MLM alone, full-sentence
rows, dynamic masking).

Presets:
- tiny: 2 layers (local, then LSH), hidden 64 (2 heads of 32), feed-forward 128, rows of 128
  tokens of the shipped 8k byte-level BPE, axial positions 8 x 16 (widths 16 + 48); LSH with 2
  hashing rounds into 8 buckets over chunks of 32 (each seeing the previous chunk), local
  chunks of 32; the small recipe (batch 32, lr 1e-3), so it learns on a CPU in minutes.
- tiny_mlm: tiny, bidirectional (`is_decoder=False`, no causal mask; chunks see one chunk
  before and one after), MLM on the 8k WordPiece vocabulary.
- crime_and_punishment: google/reformer-crime-and-punishment's released config.json, which
  transformers' `ReformerConfig` docstring names as the model its defaults resemble: 6 layers
  alternating local and LSH (local first), hidden 256, 2 heads of 64, feed-forward 512, ReLU,
  hidden dropout 0.05, axial positions 512 x 1024 (widths 64 + 192) over rows up to 524288
  tokens, chunks of 64 seeing one chunk before, one hashing round into 64 x 128 factorised
  buckets, a 320-token sentencepiece vocabulary (pass one of that size with
  `--config.data.vocab`). Rows here are 65536 tokens (a multiple of the chunks and within the
  axial table; the release was trained on the whole novel at 524288); the recipe is the shared
  paper-scale one (AdamW), not the paper's Adafactor.
- enwik8: the paper's enwik8-64K shape (section 5: d_model 1024, d_ff 4096, 8 heads, 12
  layers, rows of 2^16 = 65536 tokens, 8 sequences a batch): all LSH layers; axial positions
  256 x 256 (widths 256 + 768), chunks of 256 and 4 hashing rounds into 16 x 32 factorised
  buckets (2 · 65536 / 256 = 512 buckets, factorised as HF's rule would) are our choices
  where the paper's text gives none; vocabulary from `--config.data.vocab`.
"""

import ml_collections

from bertology import recipes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.errors import UserError

TINY = dict(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, max_position_embeddings=128,
            attn_layers=["local", "lsh"], num_hashes=2, num_buckets=8, lsh_attn_chunk_length=32,
            local_attn_chunk_length=32, axial_pos_shape=[8, 16], axial_pos_embds_dim=[16, 48])
SIZES = {
    "tiny": TINY,
    "tiny_mlm": dict(TINY, lsh_num_chunks_after=1, local_num_chunks_after=1),
    "crime_and_punishment": dict(
        num_layers=6, hidden_size=256, num_heads=2, head_size=64, intermediate_size=512, vocab_size=320,
        max_position_embeddings=524288, attn_layers=["local", "lsh"] * 3, num_hashes=1, num_buckets=[64, 128],
        lsh_attn_chunk_length=64, local_attn_chunk_length=64, axial_pos_shape=[512, 1024],
        axial_pos_embds_dim=[64, 192], dropout_rate=0.05, attention_dropout_rate=0.05, lsh_attention_dropout_rate=0.0),
    "enwik8": dict(
        num_layers=12, hidden_size=1024, num_heads=8, intermediate_size=4096, max_position_embeddings=65536,
        attn_layers=["lsh"] * 12, num_hashes=4, num_buckets=[16, 32], lsh_attn_chunk_length=256,
        local_attn_chunk_length=256, axial_pos_shape=[256, 256], axial_pos_embds_dim=[256, 768]),
}
LENGTHS = {"tiny": 128, "tiny_mlm": 128, "crime_and_punishment": 65536, "enwik8": 65536}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)

# The layout every preset has (the family fills it in and refuses anything else; stated so that a
# run's config.json reads as what it computes).
ARCHITECTURE = dict(norm="pre", type_vocab_size=0, embedding_norm=False, pooler=False, activation="relu",
                    layer_norm_eps=1e-12, axial_pos_embds=True, lsh_num_chunks_before=1, local_num_chunks_before=1)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    paper = not preset.startswith("tiny")
    causal = preset != "tiny_mlm"
    sizes = dict(SIZES[preset])
    vocab_size = sizes.pop("vocab_size", None)
    c = recipes.pretraining({}, family="reformer", objective="causal_lm" if causal else "roberta", paper=paper)
    c.model.update(ARCHITECTURE)
    c.model.update({"lsh_num_chunks_after": 0, "local_num_chunks_after": 0, "is_decoder": causal, **sizes})
    if vocab_size is not None:
        c.model.vocab_size = vocab_size
    c.data.max_seq_length = LENGTHS[preset]
    if causal:
        c.data.update(objective="causal")
    else:
        c.data.update(instances="full_sentences", masking="dynamic")
    if preset == "tiny":
        c.data.vocab = str(BYTE_BPE_VOCAB)
    if paper:
        c.data.vocab = None
        c.batch_size = 8  # the paper's 8 sequences a step
    return c
