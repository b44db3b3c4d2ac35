"""Skip-Thought pretraining (Kiros et al. 2015): sentence vectors from generating the sentences
around each sentence.

    python -m bertology.pretrain --config configs/skip_thought.py:tiny --workdir runs/st_tiny
    python -m bertology.finetune --config configs/finetune/embedded.py --config.init_checkpoint=runs/st_tiny ...

An encoder reads a sentence into one vector (its pooled first token); a decoder for the previous
sentence and one for the next generate them from that vector alone (their cross-attention's one
key), sharing the token table. The loss is the two decoders' mean token cross-entropies. The
paper's encoder and decoders were GRUs (2400 units, 620-d words, 20k words, BookCorpus); here
they are the core's Transformer stacks with BERT's shapes (presets tiny ... base), and rows of
32 tokens per sentence. Fine-tuning reads the encoder, its pooled vector the sentence's.
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = ("tiny", "mini", "small", "base")


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = recipes.pretraining(bert_preset(preset), family="skip_thought", objective="skip_thought",
                            paper=preset not in recipes.SMALL_PRESETS)
    c.data.update(objective="skip_thought", max_seq_length=32)
    c.model.type_vocab_size = 0  # one sentence per row
    return c
