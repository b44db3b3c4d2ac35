"""Fine-tune on the long-range task (`bertology.tasks.long_range`: a document's class is named once,
after its first 512 tokens; no download), from scratch, with one of four tiny encoders:

    python -m bertology.finetune --config configs/finetune/long_range.py:roberta_512 --workdir runs/lr_roberta
    python -m bertology.finetune --config configs/finetune/long_range.py:longformer_4096 --workdir runs/lr_longformer
    python -m bertology.finetune --config configs/finetune/long_range.py:modernbert_4096 --workdir runs/lr_modernbert
    python -m bertology.finetune --config configs/finetune/long_range.py:reformer_4096 --workdir runs/lr_reformer
    python -m benchmarks.long_range            # all four, and the accuracy table

- roberta_512: RoBERTa-tiny on rows truncated to 512 tokens: the key is never in them, so it is at
  chance (1/K) whatever it learns; the baseline that shows the task needs reach.
- longformer_4096: a tiny Longformer (Beltagy et al. 2020) over the whole 4,096-token row, a
  64-token window in each layer and global attention on [CLS] (put there by the family for
  classification, `longformer.task_inputs`), so [CLS] reads every token in every layer.
- modernbert_4096: a tiny ModernBERT (Warner et al. 2024) over the whole row, its layers
  global, local (64-token window), local: its global layer lets every token reach the key.
- reformer_4096: a tiny bidirectional Reformer (Kitaev et al. 2020): a local layer (64-token
  chunks, each seeing its neighbours) then an LSH layer (2 hashing rounds, 64-token chunks), so a
  token reaches far only to tokens that hash with it; the head reads the first token.

All four share the RoBERTa BPE vocabulary, the shape (hidden 128, 2 heads) and the recipe, so
what differs is how far a token sees. The settings of the task are `data.long_range_*`
(`bertology.tasks.long_range.DEFAULTS`: 4,096-token documents, 4 classes, 1,000 training and 200
validation documents).
"""

import pathlib

import ml_collections

import bertology
from bertology.errors import UserError
from bertology.tasks.long_range import DEFAULTS
from bertology.train.finetune import default_config

PRESETS = ("roberta_512", "longformer_4096", "modernbert_4096", "reformer_4096")
WINDOW = 64
BPE_VOCAB = pathlib.Path(bertology.__file__).parent / "data" / "assets" / "bpe_cased_roberta_8k.model"  # RoBERTa's
# RoBERTa-tiny's shape (configs/roberta.py:tiny), without dropout: the task is one fact per document.
SHAPE = dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, dropout_rate=0.0,
             attention_dropout_rate=0.0)


def get_config(preset: str = "longformer_4096") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    c = default_config("long_range")
    c.data.update(DEFAULTS)
    c.data.vocab = str(BPE_VOCAB)
    c.batch_size, c.eval_batch_size, c.epochs = 8, 8, 2
    c.optimizer.learning_rate = 1e-3
    c.log_every = 25
    roberta = dict(family="roberta", type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5, **SHAPE)
    if preset == "roberta_512":
        c.model.update(roberta, max_position_embeddings=514)
        c.data.max_seq_length = 512
    elif preset == "longformer_4096":
        c.model.update(roberta, family="longformer", max_position_embeddings=4098, attention_window=[WINDOW],
                       max_global_tokens=1)
        c.data.max_seq_length = 4096
    elif preset == "reformer_4096":
        # the family fills in the rest of its architecture (pre-LN reversible layers, no segments)
        c.model = ml_collections.ConfigDict(dict(
            family="reformer", vocab_size=c.model.vocab_size, **SHAPE, max_position_embeddings=4096,
            is_decoder=False, attn_layers=["local", "lsh"], num_hashes=2, lsh_attn_chunk_length=WINDOW,
            local_attn_chunk_length=WINDOW, lsh_num_chunks_after=1, local_num_chunks_after=1,
            axial_pos_shape=[64, 64], axial_pos_embds_dim=[32, 96]))
        c.data.max_seq_length = 4096
    else:
        # the family fills in the rest of its architecture (configs/modernbert.py: pre-LN, rotary, GeGLU, no bias)
        c.model = ml_collections.ConfigDict(dict(
            family="modernbert", vocab_size=c.model.vocab_size, **SHAPE, max_position_embeddings=4096,
            rope_theta=160000.0, local_rope_theta=10000.0, local_attention=WINDOW, global_attn_every_n_layers=3,
            layer_norm_eps=1e-5, scale_residual_init=True))
        c.model.update(num_layers=3, intermediate_size=256)
        c.data.max_seq_length = 4096
    return c
