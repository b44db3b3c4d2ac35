"""How contextual a word's vectors are, layer by layer: Ethayarajh (2019), "How Contextual are
Contextualized Word Representations?".

The word's vector in each sentence (the mean of its sub-word pieces, at its first occurrence) is
read at every layer of the trunk fine-tuning uses (`bertology.features.layer_states`; 0 is the
embedding output). Per layer:
- self-similarity: the mean cosine between the word's vectors in every pair of sentences (1: the
  layer ignores the context);
- anisotropy: the mean cosine between random pairs of token vectors of the same sentences, the
  baseline any two vectors share in that layer (Ethayarajh samples random words the same way);
- adjusted self-similarity: the difference, what the word's vectors share beyond that baseline.
A sentence without the word is refused with its line number.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertology.analysis.plots import pyplot, save
from bertology.errors import UserError

ANISOTROPY_PAIRS = 1000


def word_pieces(tokenizer: Any, text: str, word: str) -> range:
    """The token indices (without [CLS]) of the first whole-word occurrence of `word` in `text`
    (either case: "Return" at a sentence's start is the word "return"): the tokens of the text up
    to the word's end beyond those of the text before it. Raises ValueError when it is not there."""
    lower = text.lower()
    at = next((i for i in range(len(text)) if lower.startswith(word.lower(), i)
               and (i == 0 or not text[i - 1].isalnum())
               and (i + len(word) == len(text) or not text[i + len(word)].isalnum())), None)
    if at is None:
        raise ValueError(word)
    return range(len(tokenizer.encode(text[:at].rstrip())), len(tokenizer.encode(text[:at + len(word)])))


def unit(vectors: np.ndarray) -> np.ndarray:
    """Each vector (last axis) scaled to length 1; cosines are then dot products."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def self_similarity(checkpoint: str | pathlib.Path, texts: Sequence[str], word: str, *, max_seq_length: int = 128,
                    seed: int = 0) -> dict[str, Any]:
    """{'word', 'contexts', 'layers': [{'layer', 'self_similarity', 'anisotropy', 'adjusted'}]}."""
    from bertology import models
    from bertology.data.tokenizers import for_data
    from bertology.features import layer_states
    from bertology.train.checkpoint import read_json

    if len(texts) < 2:
        raise UserError(f"{len(texts)} sentence(s); self-similarity compares the word across at least 2")
    # the run's settings alone: its weights are read once, by layer_states
    config = read_json(pathlib.Path(checkpoint) / "config.json", "pass the --workdir of a bertology run")
    if models.family(config["model"]["family"]).reads_words:
        raise UserError(f"a {config['model']['family']} run reads words, not the sub-word pieces this tool locates; "
                        "use a sub-word model's run (BERT-style, GPT, T5 encoder)")
    tokenizer = for_data(config["data"])
    spans = []
    for line, text in enumerate(texts, 1):
        try:
            pieces = word_pieces(tokenizer, text, word)
        except ValueError:
            raise UserError(f"sentence {line} ({text!r}) does not contain the word {word!r}; give sentences that "
                            "all use it") from None
        if pieces.stop + 1 >= max_seq_length:  # [CLS] first, [SEP] last
            raise UserError(f"sentence {line}: {word!r} ends at token {pieces.stop} of {max_seq_length}; raise "
                            "--max_seq_length")
        spans.append(pieces)
    states = layer_states(checkpoint, texts, max_seq_length=max_seq_length)
    layers, mask = states["layers"].astype(np.float64), states["input_mask"]
    words = np.stack([layers[i, :, 1 + s.start:1 + s.stop].mean(1) for i, s in enumerate(spans)], 1)  # [layers, n, H]
    # the random pairs of real tokens ([CLS] and [SEP] left out), the same for every layer
    real = np.array([(i, t) for i in range(len(texts)) for t in range(1, int(mask[i].sum()) - 1)])
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, len(real), (2, ANISOTROPY_PAIRS))
    (ra, ta), (rb, tb) = real[a[a != b]].T, real[b[a != b]].T
    rows = []
    for layer, vectors in enumerate(words):
        n = len(vectors)
        u = unit(vectors)
        self_sim = float(((u @ u.T).sum() - n) / (n * (n - 1)))
        aniso = float(np.mean(np.sum(unit(layers[ra, layer, ta]) * unit(layers[rb, layer, tb]), -1)))
        rows.append({"layer": layer, "self_similarity": self_sim, "anisotropy": aniso, "adjusted": self_sim - aniso})
    return {"word": word, "contexts": len(texts), "layers": rows}


def plot(result: dict[str, Any], path: pathlib.Path) -> None:
    plt = pyplot()
    layers = [r["layer"] for r in result["layers"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("self_similarity", "self-similarity"), ("anisotropy", "anisotropy (random pairs)"),
                       ("adjusted", "adjusted self-similarity")):
        ax.plot(layers, [r[key] for r in result["layers"]], marker="o", label=label)
    ax.set_xticks(layers)
    ax.set_xlabel("layer (0: embeddings)")
    ax.set_ylabel("mean cosine")
    ax.set_title(f"{result['word']!r} in {result['contexts']} contexts")
    ax.legend(fontsize="small")
    save(fig, path)
