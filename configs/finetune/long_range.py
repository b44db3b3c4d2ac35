"""Fine-tune on the long-range task (`bertology.tasks.long_range`: a document's class is named once,
after its first 512 tokens; no download) with tiny encoders, in two stages:

    # stage 1: the skill, on 128-token documents (the key after 32 words)
    python -m bertology.finetune --config configs/finetune/long_range.py:roberta_short --workdir runs/lr/roberta_short
    python -m bertology.finetune --config configs/finetune/long_range.py:modernbert_short --workdir runs/lr/modernbert_short
    python -m bertology.finetune --config configs/finetune/long_range.py:reformer_short --workdir runs/lr/reformer_short
    # the Longformer and the BigBird start from the short RoBERTa, as their papers start theirs
    python -m bertology.families.longformer.longify --from runs/lr/roberta_short --to runs/lr/longformer_init \\
        --positions 4096 --window 64
    python -m bertology.families.bigbird.warm_start --from runs/lr/roberta_short --to runs/lr/bigbird_init \\
        --positions 4096 --block_size 64 --random_blocks 3
    # stage 2: the 4,096-token documents, each from its stage-1 run
    python -m bertology.finetune --config configs/finetune/long_range.py:roberta_512 \\
        --config.init_checkpoint=runs/lr/roberta_short --workdir runs/lr/roberta_512
    python -m bertology.finetune --config configs/finetune/long_range.py:longformer_4096 \\
        --config.init_checkpoint=runs/lr/longformer_init --workdir runs/lr/longformer_4096
    (bigbird_4096 likewise from runs/lr/bigbird_init; modernbert_4096 and reformer_4096 from their _short runs)
    python -m benchmarks.long_range            # all of it, and the accuracy table

Why two stages: from scratch, the Longformer and the Reformer did not find the key in a
4,096-token document in a few hundred steps (at chance, docs/measurements.md; ModernBERT's run
was not finished). The key is one of ~4,000 tokens, so
the gradient that would teach [CLS] to attend to it is diluted ~4,000-fold; on 128-token
documents the same models learn the task in a few hundred steps (RoBERTa 98.5%, ModernBERT 99.5%
on the short validation documents), and 60 steps on the long documents carry the skill over to
the Longformer (84.0%), the BigBird (83.0%) and ModernBERT (68.0%), as Longformer and BigBird
themselves start from RoBERTa (its positions copied out to 4,096). The Reformer's first token
reaches the key only when the two hash into one bucket, so its short stage runs 8-token chunks,
where that is so at 128 tokens too (`REFORMER_CHUNK`; 75.0% short, 72.0% long).

- roberta_512: RoBERTa-tiny on rows truncated to 512 tokens: the key is never in them, so it is at
  chance (1/K) whatever it learned; the baseline that shows the task needs reach.
- longformer_4096: a tiny Longformer over the whole 4,096-token row, a 64-token window in each
  layer and global attention on [CLS] (put there by the family for classification,
  `longformer.task_inputs`), so [CLS] reads every token in every layer.
- bigbird_4096: a tiny BigBird over the whole row, blocks of 64 tokens, 3 random blocks each, the
  first and last blocks global: [CLS], in the first block, reads every token in every layer.
- modernbert_4096: a tiny ModernBERT (Warner et al. 2024) over the whole row, its layers
  global, local (64-token window), local: its global layer lets every token reach the key.
- reformer_4096: a tiny bidirectional Reformer (Kitaev et al. 2020): a local layer (8-token
  chunks, each seeing its neighbours) then an LSH layer (2 hashing rounds, 8-token chunks), so a
  token reaches far only to tokens that hash with it; the head reads the first token.

All share the RoBERTa BPE vocabulary, the shape (hidden 128, 2 heads) and the recipe (the
Reformer's short stage takes as many steps on 4,000 documents seen once), so what differs is how
far a token sees. The settings of the task are `data.long_range_*`
(`bertology.tasks.long_range.DEFAULTS`: 4,096-token documents, 4 classes, 1,000 training and 200
validation documents).
"""

import pathlib

import ml_collections

import bertology
from bertology.errors import UserError
from bertology.tasks.long_range import DEFAULTS
from bertology.train.finetune import default_config, run_settings

MODELS = ("roberta", "longformer", "bigbird", "modernbert", "reformer")
PRESETS = ("roberta_short", "modernbert_short", "reformer_short", "roberta_512", "longformer_4096", "bigbird_4096",
           "modernbert_4096", "reformer_4096")
WINDOW = 64
# The Reformer's chunks, in both stages (the second takes the first's model block): small enough that
# on 128-token documents the first token reaches the key only through its hash bucket, so the short
# stage trains the hashing that must find the key among 4,096 tokens. With 64-token chunks (2 chunks
# seeing each other: the whole row) it learned the short task, 99.5%, and stayed at chance on the long
# documents, 27.0%; with 8-token chunks, 75.0% and 72.0% (docs/measurements.md).
REFORMER_CHUNK = 8
# Stage 1's documents: short enough that the key is one of ~100 tokens.
SHORT = dict(long_range_tokens=128, long_range_prefix=32)
BPE_VOCAB = pathlib.Path(bertology.__file__).parent / "data" / "assets" / "bpe_cased_roberta_8k.model"  # RoBERTa's
# RoBERTa-tiny's shape (configs/roberta.py:tiny), without dropout: the task is one fact per document.
SHAPE = dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, dropout_rate=0.0,
             attention_dropout_rate=0.0)


def model_block(name: str, vocab_size: int) -> ml_collections.ConfigDict:
    """The `model` block of encoder `name` (one of MODELS)."""
    roberta = dict(family="roberta", type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5, **SHAPE)
    if name == "roberta":
        return ml_collections.ConfigDict(dict(roberta, vocab_size=vocab_size, max_position_embeddings=514))
    if name == "longformer":
        return ml_collections.ConfigDict(dict(roberta, vocab_size=vocab_size, family="longformer",
                                              max_position_embeddings=4098, attention_window=[WINDOW],
                                              max_global_tokens=1))
    if name == "bigbird":  # the released models' blocks: 64 tokens, 3 random blocks each
        return ml_collections.ConfigDict(dict(roberta, vocab_size=vocab_size, family="bigbird", position_offset=0,
                                              max_position_embeddings=4096, sparse_block_size=WINDOW,
                                              num_random_blocks=3))
    if name == "reformer":
        # the family fills in the rest of its architecture (pre-LN reversible layers, no segments); the
        # axial tables start at the token table's scale (HF's default N(0, 1) swamps the N(0, 0.02) token
        # embeddings: with it the short stage stayed at chance, 25.0%, against 100% with 0.02)
        return ml_collections.ConfigDict(dict(
            family="reformer", vocab_size=vocab_size, **SHAPE, max_position_embeddings=4096,
            is_decoder=False, attn_layers=["local", "lsh"], num_hashes=2, lsh_attn_chunk_length=REFORMER_CHUNK,
            local_attn_chunk_length=REFORMER_CHUNK, lsh_num_chunks_after=1, local_num_chunks_after=1,
            axial_pos_shape=[64, 64], axial_pos_embds_dim=[32, 96], axial_norm_std=0.02))
    # the family fills in the rest of its architecture (configs/modernbert.py: pre-LN, rotary, GeGLU, no bias)
    return ml_collections.ConfigDict(dict(
        family="modernbert", vocab_size=vocab_size, **{**SHAPE, "num_layers": 3, "intermediate_size": 256},
        max_position_embeddings=4096, rope_theta=160000.0, local_rope_theta=10000.0, local_attention=WINDOW,
        global_attn_every_n_layers=3, layer_norm_eps=1e-5, scale_residual_init=True))


def get_config(preset: str = "longformer_4096") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    name, _, length = preset.partition("_")
    c = default_config("long_range")
    c.data.update(DEFAULTS)
    c.data.vocab = str(BPE_VOCAB)
    c.model = ml_collections.ConfigDict({**run_settings(), **model_block(name, c.model.vocab_size).to_dict()})
    c.batch_size, c.eval_batch_size = 8, 8
    c.log_every = 25
    if length == "short":  # stage 1, from scratch: 500 steps of 8
        c.data.update(SHORT)
        c.data.max_seq_length = SHORT["long_range_tokens"]
        c.epochs = 4
        c.optimizer.learning_rate = 1e-3
        if name == "reformer":
            # as many steps, each on a fresh document: what the first token sees in its local layer (its
            # 8-token chunk and the two beside it, filler) tells 1,000 documents apart, and over 4 epochs
            # the model learned them by heart (100% on its training batches, 29.5% on validation)
            c.data.long_range_train = 4000
            c.epochs = 1
    else:  # stage 2, from the stage-1 run (init_checkpoint): a few dozen steps at a tenth of the rate
        c.data.max_seq_length = int(length)
        c.total_steps = 60
        c.optimizer.learning_rate = 1e-4
    return c
