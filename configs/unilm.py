"""UniLM pretraining (Dong et al. 2019): one shared BERT-shaped Transformer, each row of a batch
trained as a bidirectional, left-to-right, right-to-left or sequence-to-sequence LM by its own
attention mask, with the masked-LM loss at the masked tokens.

    python -m bertology.pretrain --config configs/unilm.py:tiny --workdir runs/unilm_tiny

Presets `tiny` (L2/H128), `base` (BERT-base) and `large` (BERT-large, what the paper starts
from). The model is BERT's encoder and MLM head (family `unilm`, objective `roberta`: MLM alone)
with six segment types (unilm-v1's `--new_segment_ids`); the data transform `unilm` mixes the
kinds 1/3 bidirectional, 1/3 seq2seq, 1/6 left-to-right, 1/6 right-to-left in every batch
(`data.noise.<kind>` shares) and masks 15% of the tokens 80/10/10, 20% of the masks bigrams or
trigrams (`data.noise.ngram_prob`, `max_ngram`), afresh each batch.

Starting from BERT (the paper starts from BERT-large): `--config.init_checkpoint=DIR` with a BERT
run or a converted Hugging Face BERT of the same shape (`families.unilm.model.init_from`: every encoder
tensor and the MLM head; the segment table widened to six rows as unilm-v1 does).

Recipe of the paper (section 3, not checked against the PDF here): 512 tokens, batch 330,
Adam lr 3e-5, 40k warmup, linear decay, 770k steps, weight decay 0.01, dropout 0.1; no NSP
(the paper keeps NSP for its bidirectional rows; this objective is MLM alone). tiny: the small
recipe (batch 32, lr 1e-3, 60 warmup, 600 steps, 128 tokens).
"""

import ml_collections

from bertology import recipes
from bertology.errors import UserError
from bertology.models.presets import bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = ("tiny", "base", "large")


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    paper = preset != "tiny"
    c = recipes.pretraining(bert_preset(preset), family="unilm", objective="roberta", paper=paper)
    c.model.type_vocab_size = 6
    c.data.update(objective="unilm", masking="dynamic")
    if paper:
        c.data.update(max_seq_length=512, max_predictions_per_seq=77)
        c.batch_size, c.total_steps = 330, 770_000
        c.optimizer.update(learning_rate=3e-5, warmup_steps=40_000)
    return c
