"""Byte-level BPE (GPT-2, RoBERTa) from `vocab.json` + `merges.txt`, as Hugging Face tokenizes it.

A checkpoint only makes sense with the exact ids it was trained on, so ids must equal those of
transformers' slow `GPT2Tokenizer` / `RobertaTokenizer`. The `tokenizers` library's ByteLevel
pre-tokenizer (GPT-2's splitting regex over the text's UTF-8 bytes, each byte shown as a printable
character), BPE model and ByteLevel decoder give those ids (the tests compare them on unicode-rich
text and every code point below U+0800) at Rust speed, so no merge loop is written here.

Which special tokens exist is read from the vocab: RoBERTa's `<s> <pad> </s> <unk> <mask>`, or
else GPT-2's single `<|endoftext|>`, which then plays every role (as in Hugging Face) except
`[MASK]`: GPT-2 has none, so `mask_id` is None and masked-LM data cannot be built with it. As in
Hugging Face, a special token written in the text is that token, and RoBERTa's `<mask>` swallows
the whitespace before it (so `decode` cannot give that whitespace back); any other text comes back
byte for byte from `decode(encode(text))`.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from bertology.errors import UserError

EOS = "<|endoftext|>"  # GPT-2's only special token
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # fairseq: ids 0-3, <mask> last
WORD_START = "\u0120"  # "Ġ": the byte-level character of a space
MERGES_HEADER = "#version: 0.2"


class ByteLevelBPETokenizer:
    """A GPT-2 / RoBERTa byte-level BPE; ids are the vocab.json ids."""

    def __init__(self, vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> None:
        vocab_path, merges_path = pathlib.Path(vocab_path), pathlib.Path(merges_path)
        self.vocab = _read_vocab(vocab_path)
        self.id_to_token = sorted(self.vocab, key=self.vocab.__getitem__)
        self.vocab_size = len(self.vocab)
        merges = _read_merges(merges_path)
        try:
            model = models.BPE(self.vocab, merges)
        except Exception as e:  # the tokenizers library raises a bare Exception for bad merges
            raise UserError(
                f"{merges_path} does not fit {vocab_path}: {str(e).rsplit(': ', 1)[-1]}; "
                "use the merges.txt released with that vocab.json"
            ) from None
        self._bpe = tokenizers.Tokenizer(model)
        self._bpe.pre_tokenizer = gpt2_pre_tokenizer()
        self._bpe.decoder = decoders.ByteLevel()
        if all(t in self.vocab for t in ROBERTA_SPECIALS):
            self.convention = "roberta"
            # the tokenizer_config.json an export writes: the transformers class that gives these
            # ids, and <mask> stripping the whitespace before it, which transformers 4's
            # RobertaTokenizer did by itself and transformers 5's does only when told
            self.hf_config = {"tokenizer_class": "RobertaTokenizer", "mask_token": {
                "__type": "AddedToken", "content": "<mask>", "lstrip": True, "rstrip": False, "normalized": False,
                "single_word": False, "special": True}}
            self.cls_id, self.pad_id, self.sep_id, self.unk_id, self.mask_id = (
                self.vocab[t] for t in ROBERTA_SPECIALS
            )
            self.eos_id = self.sep_id
            specials = ROBERTA_SPECIALS
        elif EOS in self.vocab:
            self.convention = "gpt2"
            self.hf_config = {"tokenizer_class": "GPT2Tokenizer"}
            self.eos_id = self.cls_id = self.sep_id = self.pad_id = self.unk_id = self.vocab[EOS]
            self.mask_id = None
            specials = (EOS,)
        else:
            raise UserError(
                f"byte-level BPE vocab {vocab_path} has neither GPT-2's {EOS} nor RoBERTa's "
                f"{' '.join(ROBERTA_SPECIALS)}; retrain it with "
                "`python -m bertology.tokenizer --kind bytebpe`"
            )
        # Hugging Face's RobertaTokenizer strips the whitespace before <mask> (lstrip), so
        # "a <mask>" is two tokens, "a" and "<mask>"; every other special is matched as written.
        self._bpe.add_special_tokens(
            [tokenizers.AddedToken(t, special=True, normalized=False, lstrip=t == "<mask>") for t in specials]
        )
        self.special_ids = frozenset(self.vocab[t] for t in specials)
        self._word_start = np.array(
            [i in self.special_ids or t.startswith(WORD_START) for i, t in enumerate(self.id_to_token)], dtype=bool
        )

    def tokenize(self, text: str) -> list[str]:
        """Tokens in the byte-level alphabet: a space shows as Ġ, a newline as Ċ."""
        return self._bpe.encode(text).tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without <s>/</s>: the data pipeline adds those."""
        return self._bpe.encode(text).ids

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_token[int(i)] for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens written out, so decode(encode(text)) == text.

        Padding is not dropped: GPT-2 pads with <|endoftext|>, which cannot be told from the one
        ending a document, so cut padding off before decoding.
        """
        return self._bpe.decode([int(i) for i in ids], skip_special_tokens=False)

    def word_starts(self, ids: np.ndarray) -> np.ndarray:
        """True where a token starts with a space (Ġ) or is special, as fairseq's whole-word
        masking for RoBERTa decides it; same shape as `ids`."""
        return self._word_start[np.asarray(ids)]


def gpt2_pre_tokenizer() -> pre_tokenizers.ByteLevel:
    """GPT-2's splitting regex over the UTF-8 bytes, no space added in front (HF's default); the
    trainer uses it too, so merges are learnt on exactly the pieces that encoding will see."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _read_vocab(path: pathlib.Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{path} is not a JSON vocab; pass GPT-2/RoBERTa's vocab.json") from None
    if not (
        isinstance(vocab, dict)
        and all(isinstance(i, int) for i in vocab.values())
        and sorted(vocab.values()) == list(range(len(vocab)))
    ):
        raise UserError(
            f"{path} does not map tokens to the ids 0..N-1; pass GPT-2/RoBERTa's vocab.json "
            "(a JSON object token -> id)"
        )
    return vocab


def _read_merges(path: pathlib.Path) -> list[tuple[str, str]]:
    """Merge rules, highest priority first; a `#version` header line and blank lines are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a UTF-8 merges.txt; pass GPT-2/RoBERTa's merges.txt") from None
    merges = []
    for number, line in enumerate(lines, start=1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        pair = line.split(" ")
        if len(pair) != 2 or not all(pair):
            raise UserError(
                f"{path} line {number}: {line[:40]!r} is not two tokens separated by one space; "
                "pass GPT-2/RoBERTa's merges.txt"
            )
        merges.append((pair[0], pair[1]))
    return merges
