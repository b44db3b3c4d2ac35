"""Word-level vocabularies and ELMo's character ids (allenai/bilm-tf `bilm/data.py` conventions).

ELMo predicts whole words but reads each word through its UTF-8 bytes. The word vocabulary is a
WordPiece `vocab.txt` with only whole words in it, so the shared tokenizer splits text into words
(BERT's punctuation split, cased since the vocab is) and maps each word to its id or `[UNK]`;
`<S>`/`</S>` wrap every sentence as in bilm-tf. Character ids are the reference's: bytes 0-255,
then 256 begin-of-sentence, 257 end-of-sentence, 258 begin-of-word, 259 end-of-word, 260 padding
(bilm-tf's 261 training ids), all shifted up by one so that 0 marks a position with no word (its
262 inference ids, which this codebase always uses).
"""

from __future__ import annotations

import collections
import os
import pathlib

import numpy as np

from bertology.data.tokenizers.wordpiece import PAD, SPECIAL_TOKENS, BasicTokenizer, write_vocab

BOS, EOS = "<S>", "</S>"
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
N_CHARACTERS = 262  # bilm-tf's 261 ids + 1, 0 meaning "no word here"


def word_char_ids(word: str, max_chars: int) -> np.ndarray:
    """One word's `max_chars` character ids in the 262-id convention: BOW, at most
    max_chars - 2 UTF-8 bytes, EOW, padding; `<S>`/`</S>` get bilm-tf's BOS/EOS codes."""
    code = np.full(max_chars, PAD_CHAR, np.int32)
    if word in (BOS, EOS):
        code[:3] = BOW_CHAR, BOS_CHAR if word == BOS else EOS_CHAR, EOW_CHAR
    else:
        data = word.encode("utf-8", "ignore")[: max_chars - 2]
        code[0] = BOW_CHAR
        code[1 : len(data) + 1] = np.frombuffer(data, np.uint8)
        code[len(data) + 1] = EOW_CHAR
    return code + 1


def char_id_table(tokens: list[str], max_chars: int) -> np.ndarray:
    """[len(tokens), max_chars] int16 character ids of every vocabulary entry, so a batch of word
    ids becomes character ids by one gather; `[PAD]` is all zeros (no word)."""
    table = np.stack([word_char_ids(t, max_chars) for t in tokens]).astype(np.int16)
    table[tokens.index(PAD)] = 0
    return table


def build_word_vocab(corpus: str | os.PathLike, size: int, out: str | os.PathLike) -> pathlib.Path:
    """Write a `vocab.txt` of BERT's specials, `<S>`, `</S>` and the `size` most frequent cased
    words of `corpus` (ties broken alphabetically, so the file is deterministic)."""
    basic = BasicTokenizer(do_lower_case=False)
    counts: collections.Counter[str] = collections.Counter()
    with open(corpus, encoding="utf-8", errors="replace") as f:
        for line in f:
            counts.update(basic.tokenize(line))
    reserved = {*SPECIAL_TOKENS, BOS, EOS}
    words = sorted((w for w in counts if w not in reserved), key=lambda w: (-counts[w], w))[:size]
    return write_vocab([*SPECIAL_TOKENS, BOS, EOS, *words], out)


def embedded_word_vocab(size: int) -> pathlib.Path:
    """The embedded corpus's word vocabulary of `size` words, built once into the cache."""
    from bertology.data.embedded import embedded_corpus_path

    corpus = embedded_corpus_path()
    path = corpus.parent / f"words_{size}_{corpus.stem}.txt"
    return path if path.exists() else build_word_vocab(corpus, size, path)
