"""ELMo's pretraining data: `data.objective="bilm"` (`BidirectionalLM`), the forward and backward
word streams cut into lanes (`bertology.data.lanes`) that the LSTM states carry across.
Registered with the shared registry (`bertology.data.transforms`), which finds it by importing
this module.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data import lanes, words
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, Transform, register
from bertology.errors import UserError


@register("bilm")
class BidirectionalLM(Transform):
    """ELMo's lanes, as bilm-tf's `BidirectionalLMDataset` feeds its stateful training: every
    sentence as `<S> words </S>` (a word-level vocabulary, `data/words.py`), the sentences of the
    documents in order as one forward stream, and the same sentences each reversed
    (`</S> ... <S>`) as the backward stream; both cut at the same places into lanes of
    data.max_seq_length words (`lanes.cut`), which the model reads carrying its LSTM states from
    segment to segment. As in bilm-tf, nothing separates documents but the sentence marks, and
    every word predicts the next of its stream, across sentence and segment boundaries.

    Keys [lanes, steps, length]: input_ids, targets / target_weights (the next word of the
    forward stream), backward_input_ids, backward_targets / backward_target_weights (the next of
    the backward stream: the previous word of the sentence); per batch `corrupt` adds char_ids
    and backward_char_ids [rows, length, data.max_characters_per_token] (bilm-tf's 262 ids).
    """

    contiguous = True

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
        missing = [t for t in (words.BOS, words.EOS) if t not in tokens]
        if missing:
            raise UserError(f"data.objective='bilm' needs a word vocabulary with {' and '.join(missing)}; "
                            "build one with bertology.data.words.build_word_vocab")
        self.bos_id, self.eos_id = tokens.index(words.BOS), tokens.index(words.EOS)
        self.chars = words.char_id_table(tokens, cfg.get("max_characters_per_token", 50))

    # A contiguous transform's pass takes the lane count (`Transform`), so it overrides with one argument more.
    def instances(self, documents: Sequence[Document], rng: np.random.Generator, lanes_: int) -> Batch:  # type: ignore[override]
        sentences = [np.concatenate([[self.bos_id], s, [self.eos_id]]).astype(np.int32)
                     for doc in documents for s in doc if len(s)]
        if not sentences:
            raise UserError("the corpus holds no sentences; give it some text")
        stream = {}
        for prefix, ids in (("", np.concatenate(sentences)), ("backward_", np.concatenate([s[::-1] for s in sentences]))):
            following = np.append(ids[1:], 0).astype(np.int32)
            weights = np.append(np.ones(len(ids) - 1, np.float32), 0.0).astype(np.float32)
            stream.update({f"{prefix}input_ids": ids, f"{prefix}targets": following, f"{prefix}target_weights": weights})
        return lanes.cut(stream, lanes_, self.cfg.max_seq_length, rng)

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        return {**batch, "char_ids": self.chars[batch["input_ids"]].astype(np.int32),
                "backward_char_ids": self.chars[batch["backward_input_ids"]].astype(np.int32)}
