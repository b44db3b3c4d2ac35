"""RoBERTa pretraining (Liu et al. 2019): BERT's network, trained differently.

    python -m bertology.pretrain --config configs/roberta.py:tiny --workdir runs/roberta_tiny

No NSP; FULL-SENTENCES rows (whole sentences packed to the row length, crossing documents with a
separator); dynamic masking; a byte-fallback BPE vocabulary with <s> </s> <pad> <mask> <unk>
(shipped: an 8k cased BPE trained on the embedded corpus); Adam b2 0.98, eps 1e-6, decay 0.01.
The paper's batch of 8K sequences is reached through gradient accumulation (32 x 256).
"""

import pathlib

import ml_collections

import bertology
from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)

BPE_VOCAB = pathlib.Path(bertology.__file__).parent / "data" / "assets" / "bpe_cased_roberta_8k.model"


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    paper = preset not in recipes.SMALL_PRESETS
    c = recipes.pretraining(bert_preset(preset), family="roberta", objective="roberta", paper=paper)
    # The reference embedding tables: one segment type; positions start after the padding slot.
    c.model.update(type_vocab_size=1, position_offset=2, max_position_embeddings=514, layer_norm_eps=1e-5)
    c.data.update(instances="full_sentences", masking="dynamic", vocab=str(BPE_VOCAB))
    c.optimizer.update(b2=0.98, eps=1e-6, weight_decay=0.01)
    if paper:
        c.data.update(max_seq_length=512, max_predictions_per_seq=77)
        c.batch_size, c.grad_accum_steps = 8192, 32
        c.total_steps = 500_000
        c.optimizer.update(learning_rate=6e-4 if preset == "base" else 4e-4, warmup_steps=24_000)
    return c
