"""Fixed GloVe vectors (Pennington et al. 2014) for CoVe's embedding table, read from the released
text format: one `word v1 ... vd` line per word, space-separated. CoVe reads its source through
GloVe and keeps it fixed (McCann et al. 2017, §3), so the rows a file has are constants of the
network, never parameters: training cannot move them, and a checkpoint needs the same file again.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from bertology.data.tokenizers import for_data
from bertology.errors import UserError


@functools.cache
def table(path: str, vocab: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(vectors [vocab, dim] float32, found [vocab] bool) of the vocabulary file `vocab`'s tokens
    in the GloVe file `path`: a token's exact entry, else the entry of its lowercased form (the 6B/42B releases
    are uncased); rows the file lacks are zero and not found (the model learns those)."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise UserError(f"model.glove={path}: no such file; give a GloVe text file (`word v1 ... vd` per line) or '' "
                        "for a learned table")
    if not vocab:
        raise UserError("model.glove is set but model.vocab is empty; set model.vocab to data.vocab, the vocabulary "
                        "whose rows the vectors fill")
    tokenizer = for_data({"vocab": vocab})
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    exact: dict[str, list[int]] = {}
    lowered: dict[str, list[int]] = {}
    for i, token in enumerate(tokens):
        exact.setdefault(token, []).append(i)
        lowered.setdefault(token.lower(), []).append(i)
    vectors = np.zeros((len(tokens), dim), np.float32)
    found = np.zeros(len(tokens), bool)
    with file.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if number == 1 and len(parts) - 1 != dim:
                raise UserError(f"{path}: vectors of {len(parts) - 1} numbers but model.embedding_dim={dim}; set "
                                f"model.embedding_dim={len(parts) - 1}")
            word = " ".join(parts[:-dim])  # the 840B release has words with spaces in them
            for i in exact.get(word, ()):
                vectors[i], found[i] = np.asarray(parts[-dim:], np.float32), True  # overrides a lowercased match
            for i in lowered.get(word, ()):
                if not found[i]:
                    vectors[i], found[i] = np.asarray(parts[-dim:], np.float32), True
    if not found.any():
        raise UserError(f"{path} has none of the {len(tokens)} tokens of {vocab}; give the GloVe file of the "
                        "vocabulary's language and casing")
    return vectors, found
