"""CoVe (McCann et al. 2017): train the attentional LSTM translation model on source -> target
pairs, then read its encoder as word features (`bertology.families.cove`).

    python -m bertology.finetune --config configs/cove.py:tiny --workdir runs/cove_tiny
    python -m bertology.features --checkpoint runs/cove_tiny --input sentences.txt --out cove.npz
    python -m bertology.finetune --config configs/finetune/glue.py:sst2 --config.init_checkpoint=runs/cove_tiny \\
        --config.mode=features ...

The pairs are a seq2seq task read by the fine-tuning loop (`bertology.tasks.seq2seq`): by default
`seq2seq_embedded` (a standard-library docstring's body -> its first sentence; no download); for
translation, `--config.task=seq2seq_jsonl --config.data.dir=DIR` with `{"source", "target"}` lines
(the paper's English -> German pairs: WMT 2016 multimodal, IWSLT 2016, WMT 2017). Source and
target share one word vocabulary here (the embedded corpus's words), which the paper's two
languages do not. The run's workdir is a checkpoint that features and fine-tuning read.

Presets:
- paper: the paper's network (§3): 300-d word vectors, a two-layer biLSTM of 300 per direction,
  a two-layer LSTM decoder of 300 with attention; the vectors are fixed GloVe with
  `--config.model.glove=glove.840B.300d.txt` (the paper's Common Crawl release; left out here so
  the default needs no download); a 32k-word vocabulary of the embedded corpus. The recipe is
  the shared seq2seq one (AdamW, warmup, linear decay), not the paper's.
- tiny: 32-d vectors, LSTMs of 32, 4k words, sources of 32 and targets of 16 words; seconds on a CPU.
"""

import ml_collections

from bertology.data.words import embedded_word_vocab
from bertology.errors import UserError
from bertology.train.finetune import default_config

# name: (embedding and LSTM width, words, source length, target length)
SIZES = {"tiny": (32, 4096, 32, 16), "paper": (300, 32768, 128, 48)}

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    try:
        width, words, source, target = SIZES[preset]
    except KeyError:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(SIZES)}") from None
    c = default_config("seq2seq_embedded")
    vocab = str(embedded_word_vocab(words))
    c.model = ml_collections.ConfigDict(dict(
        family="cove",
        vocab_size=ml_collections.config_dict.placeholder(int),  # None: taken from the word vocabulary
        embedding_dim=width, hidden_dim=width, n_layers=2, dropout_rate=0.2,
        glove="",  # a GloVe text file (`word v1 ... vd` lines) whose rows are fixed; "": a learned table
        vocab=vocab,  # the vocabulary whose rows the GloVe vectors fill: keep it data.vocab
    ))
    c.data.update(vocab=vocab, max_seq_length=source, max_target_length=target)
    c.eval_examples = 200  # validation rows decoded (and scored teacher-forced) at each evaluation
    c.generation = ml_collections.ConfigDict(dict(num_beams=1, length_penalty=1.0, max_new_tokens=target))
    c.epochs = 3
    c.batch_size = 32
    c.optimizer.update(learning_rate=3e-3 if preset == "tiny" else 1e-3, weight_decay=0.0)
    return c
