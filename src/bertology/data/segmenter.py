"""Word boundaries for Chinese text, so whole-word masking masks Chinese words.

BERT's WordPiece gives every CJK character a token of its own (the basic tokenizer's
`tokenize_chinese_chars`) and none of them starts with `##`, so `Tokenizer.word_starts` calls each
character a word, and whole-word, n-gram and span masking fall back to characters. Chinese BERT-wwm
(Cui et al. 2019, "Pre-Training with Whole Word Masking for Chinese BERT") masks the words a
segmenter finds instead (LTP there). Here the segmenter is jieba (`data.word_segmenter=jieba`): it
ships its dictionary, needs no download and is deterministic, so masks stay a function of the
seed and the step. Each run of consecutive single-character CJK tokens is decoded to its text and
segmented; a character inside a word is no word start. Everything else keeps the tokenizer's
boundaries.
"""

from __future__ import annotations

import logging

import numpy as np

from bertology.data.tokenizers import Tokenizer
from bertology.data.tokenizers.wordpiece import is_cjk
from bertology.errors import UserError

SEGMENTERS = ("jieba",)


class ChineseWords:
    """`word_starts` with Chinese words found by a segmenter (`data.word_segmenter`)."""

    def __init__(self, tokenizer: Tokenizer, segmenter: str = "jieba") -> None:
        if segmenter not in SEGMENTERS:
            raise UserError(f"data.word_segmenter={segmenter!r} is unknown; use one of {', '.join(SEGMENTERS)} or leave it unset")
        import jieba  # here: only runs that segment pay for its import

        self.tokenizer = tokenizer
        tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
        self.chars = [t if len(t) == 1 and is_cjk(ord(t)) else "" for t in tokens]  # one-ideograph tokens
        self.cjk = np.array([bool(c) for c in self.chars])
        self.jieba = jieba.Tokenizer()
        logging.getLogger("jieba").setLevel(logging.WARNING)  # its dictionary build logs at INFO/DEBUG

    def segment(self, text: str) -> list[str]:
        """jieba's default (precise) mode, with its HMM for words its dictionary lacks."""
        return self.jieba.lcut(text)

    def word_starts(self, ids: np.ndarray) -> np.ndarray:
        """The tokenizer's word starts ([rows, length]), with the characters that continue a
        Chinese word set False."""
        ids = np.asarray(ids)
        starts = np.array(self.tokenizer.word_starts(ids), bool)
        cjk = self.cjk[ids]
        for r in range(len(ids)):
            edges = np.flatnonzero(np.diff(np.concatenate([[0], cjk[r].astype(np.int8), [0]])))
            for a, b in zip(edges[::2], edges[1::2]):
                at = a
                for word in self.segment("".join(self.chars[i] for i in ids[r, a:b])):
                    starts[r, at + 1:at + len(word)] = False
                    at += len(word)
        return starts
