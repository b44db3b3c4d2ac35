"""context2vec (Melamud et al. 2016): bidirectional-LSTM context vectors trained with word2vec's
negative sampling against the embedding of the word in the slot (`bertology.families.context2vec`).

    python -m bertology.pretrain --config configs/context2vec.py:tiny --workdir runs/c2v_tiny

Presets:
- paper: the reference's `train_context2vec.py -u 300 -d yes`: word embeddings of 300 per direction,
  LSTMs of 600, context and target vectors of 600, a perceptron over both states; 10 negatives
  from the unigram distribution to the power 0.75; Adam at 1e-3, batches of 100 sentences, no
  dropout. The reference trained on ukWaC (2B words); here the embedded corpus's 32k words, rows
  of one sentence cut to 64 words. The shared schedule (warmup, linear decay) replaces its constant rate.
- tiny: embeddings of 64, LSTMs and vectors of 128, 4k words, 32-word rows; learns on a CPU in minutes.

Rows are single sentences, `[CLS] words [SEP]` ([CLS]/[SEP] the start and end tokens); every
word of a row is a training slot. `data.dupe_factor` passes draw their own negatives.
"""

import ml_collections

from bertology import recipes
from bertology.data.words import embedded_word_vocab
from bertology.errors import UserError

# name: (unit, words, row length)
SIZES = {"tiny": (64, 4096, 32), "paper": (300, 32768, 64)}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    unit, words, length = SIZES[preset]
    c = recipes.pretraining({}, family="context2vec", objective="context2vec", paper=False)
    c.model = ml_collections.ConfigDict(dict(
        family="context2vec",
        vocab_size=ml_collections.config_dict.placeholder(int),  # None: taken from the word vocabulary
        embedding_dim=unit, lstm_dim=2 * unit, target_dim=2 * unit, n_layers=1, dropout_rate=0.0,
    ))
    c.data.update(objective="context2vec", max_seq_length=length, vocab=str(embedded_word_vocab(words)),
                  negatives=10, ns_power=0.75)
    if preset == "paper":
        c.batch_size, c.total_steps = 100, 100_000
        c.optimizer.update(learning_rate=1e-3, weight_decay=0.0)
    else:
        c.optimizer.update(learning_rate=3e-3, weight_decay=0.0)
    return c
