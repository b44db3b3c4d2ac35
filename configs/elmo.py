"""ELMo's biLM (Peters et al. 2018; allenai/bilm-tf `bin/train_elmo.py`) on a word vocabulary.

    python -m bertology.pretrain --config configs/elmo.py:tiny --workdir runs/elmo_tiny

Presets:
- original: the reference's options: char CNN filters [[1,32],[2,32],[3,64],[4,128],[5,256],
  [6,512],[7,1024]] (2048) over 16-d embeddings of 262 char ids, 50 chars per word, relu, 2
  highway layers, projection 512; 2 LSTM layers of 4096 cells projected to 512, cell and
  projection clip 3, residual between layers, dropout 0.1; batch 128 x 3, unroll 20, clip 10.
  The reference trains with Adagrad (lr 0.2) and an 8192-sample softmax over 793,471 words of
  1B Word; here the optimizer is AdamW and the softmax full, and the vocabulary is the embedded
  corpus's 32k words unless `--config.data.vocab=` names another (a vocab.txt of words with
  BERT's specials, `<S>` and `</S>`: `bertology.data.words.build_word_vocab`).
- small / medium: the smaller released biLMs (AllenNLP's elmo_2x1024_128_2048cnn_1xhighway and
  elmo_2x2048_256_2048cnn_1xhighway, named for their shapes: 2 LSTM layers of 1024 / 2048 cells
  projected to 128 / 256, the original's 2048-filter char CNN, 1 highway layer), so their
  options.json and weights.hdf5 load into these presets; 16k / 32k words of the embedded corpus.
- tiny: 4 filters (128), 1 highway, projection 64, 256 cells, 4k words, segments of 32 words;
  learns on a CPU in a few minutes.

Training is stateful, as the reference's: the corpus is read as batch_size parallel lanes of
max_seq_length-word segments (`data/lanes.py`, the `bilm` transform), and the LSTM states each
segment ends with start the next one (`state["carry"]`, checkpointed with the run).
"""

import ml_collections
from ml_collections.config_dict import placeholder

from bertology import recipes
from bertology.data.words import embedded_word_vocab
from bertology.errors import UserError

ORIGINAL_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
SIZES = {
    "tiny": dict(filters=ORIGINAL_FILTERS[:4], n_highway=1, projection_dim=64, lstm_dim=256, words=4096, length=32),
    "small": dict(filters=ORIGINAL_FILTERS, n_highway=1, projection_dim=128, lstm_dim=1024, words=16384, length=20),
    "medium": dict(filters=ORIGINAL_FILTERS, n_highway=1, projection_dim=256, lstm_dim=2048, words=32768, length=20),
    "original": dict(filters=ORIGINAL_FILTERS, n_highway=2, projection_dim=512, lstm_dim=4096, words=32768, length=20),
}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    if preset not in SIZES:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}")
    p = dict(SIZES[preset])
    if preset == "tiny":  # half of each filter count: 128 in all
        p["filters"] = [[w, n // 2] for w, n in p["filters"]]
    c = recipes.pretraining({}, family="elmo", objective="bilm", paper=preset == "original")
    c.model = ml_collections.ConfigDict(dict(
        family="elmo",
        vocab_size=placeholder(int),  # None: taken from the word vocabulary
        filters=p["filters"],
        char_embedding_dim=16,
        n_characters=262,
        max_characters_per_token=50,
        activation="relu",
        n_highway=p["n_highway"],
        projection_dim=p["projection_dim"],
        lstm_dim=p["lstm_dim"],
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
        use_skip_connections=True,
        dropout_rate=0.1,
    ))
    c.data = ml_collections.ConfigDict(dict(
        corpus=placeholder(str),
        vocab=str(embedded_word_vocab(p["words"])),
        cache_dir=placeholder(str),
        objective="bilm",
        max_seq_length=p["length"],
        max_characters_per_token=50,
    ))
    if preset == "original":
        c.batch_size = 384
        c.optimizer.update(clip_norm=10.0)
    else:
        c.optimizer.update(learning_rate=3e-3, weight_decay=0.0)
    return c
