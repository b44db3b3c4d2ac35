"""The sequence autoencoder (Dai & Le 2015's SA-LSTM pretraining), on ELMo's LSTM code
(`families/lstm/model.py`, kind `autoencoder`).

    python -m bertology.pretrain --config configs/seq_autoencoder.py:tiny --workdir runs/sa_tiny

An LSTM reads a piece of a document (`[CLS] words [SEP]`, at most max_seq_length words), then,
from the state it ended with, reconstructs the piece word by word, teacher forced (the decoder
reads the piece shifted right behind `[SEP]`); encoder and decoder share their weights, as in the
paper. The rows are BART's (`data.objective=bart`) with every noise off, so the target is the
unchanged input; the loss is the reconstruction's cross-entropy (objective `seq2seq`).

Presets as configs/lstm_lm.py (`families.lstm.model.PRESETS`: tiny, small), but rows of 32 words for both
(the LM's segments are a stream; these are whole sentences). A classifier starts from the
checkpoint's token table and LSTM (`families.lstm.model.task_trunk`), reading the last real token's state.
"""

import ml_collections

from bertology import recipes
from bertology.data.words import embedded_word_vocab
from bertology.families.lstm import model as lstm

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(lstm.PRESETS)

NO_NOISE = dict(mask=0.0, permute_sentences=0.0, rotate=0.0, insert=0.0)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = recipes.pretraining({}, family="lstm", objective="seq2seq", paper=False)
    c.model = lstm.model_block(preset, "autoencoder")
    p = lstm.PRESETS[preset]
    c.data.update(objective="bart", max_seq_length=32, max_target_length=32, noise=NO_NOISE,
                  vocab=str(embedded_word_vocab(p["words"])))
    c.optimizer.update(learning_rate=3e-3, weight_decay=0.0)
    return c
