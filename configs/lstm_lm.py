"""A forward word-level LSTM language model (Dai & Le 2015's LM-LSTM pretraining), on ELMo's LSTM
code (`families/lstm/model.py`, kind `lm`).

    python -m bertology.pretrain --config configs/lstm_lm.py:tiny --workdir runs/lstm_lm_tiny

Presets (`families.lstm.model.PRESETS`): tiny (2 layers of 256 cells projected to 64, 4k words, segments
of 32 words; learns on a CPU in minutes) and small (2 x 1024 cells projected to 256, 16k words,
segments of 20): the shapes of one direction of ELMo's tiny and small biLMs, residual between
layers, no clipping. Dai & Le train one layer of 1024 cells; `--config.model.n_layers=1
--config.model.projection_dim=1024` is that shape.

Training is stateful, as ELMo's: the documents in order (each ended by `[SEP]`) are one word
stream cut into batch_size lanes of max_seq_length-word segments (`data.objective=contiguous_lm`,
`data/lanes.py`), and the LSTM states each segment ends with start the next one (`state["carry"]`,
checkpointed with the run). The loss is the next word's cross-entropy (objective `transfo_xl`:
language modelling with carried state). A classifier starts from the checkpoint's token table
and LSTM (`families.lstm.model.task_trunk`), reading the last real token's state.
"""

import ml_collections

from bertology import recipes
from bertology.data.words import embedded_word_vocab
from bertology.families.lstm import model as lstm

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(lstm.PRESETS)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = recipes.pretraining({}, family="lstm", objective="transfo_xl", paper=False)
    c.model = lstm.model_block(preset, "lm")
    p = lstm.PRESETS[preset]
    c.data.update(objective="contiguous_lm", max_seq_length=p["length"], vocab=str(embedded_word_vocab(p["words"])))
    c.batch_size = 16
    c.optimizer.update(learning_rate=3e-3, weight_decay=0.0)
    return c
