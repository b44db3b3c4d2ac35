"""BART's pretraining data, and MASS's, which runs on BART's network (`configs/mass.py`:
family "bart"): `data.objective="bart"` (`BartDenoising`, fairseq's noising) and "mass"
(`MassDenoising`, one masked fragment), both over one `<s> ... </s>` block of a document per row
and the noising rules of `bertology.data.noising`. Registered with the shared registry
(`bertology.data.transforms`), which finds them by importing this module.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data import noising, packing
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, Transform, noise_options, padded, register, row_tokens, seq2seq_rows
from bertology.errors import UserError


def _document_rows(documents: Sequence[Document], length: int, tokenizer: Tokenizer) -> Batch:
    """One `<s> ... </s>` piece of a document per row (BART's and MASS's sentences-to-document
    blocks): [CLS]/<s> in front, EOS at the end, at most `length` tokens."""
    pieces = packing.document_pieces(documents, length, tokenizer.cls_id, tokenizer.eos_id)
    rows = packing.one_per_row(pieces, length, tokenizer.pad_id)
    return {"input_ids": rows["input_ids"], "input_mask": rows["input_mask"]}


def _require_mask(tokenizer: Tokenizer, objective: str) -> int:
    if tokenizer.mask_id is None:
        raise UserError(f"data.objective={objective!r} needs a <mask> token and the tokenizer has none; "
                        "load it with load_tokenizer(..., add_mask=True)")
    return tokenizer.mask_id


@register("bart")
class BartDenoising(Transform):
    """BART's noising (fairseq `DenoisingDataset`): one `<s> ... </s>` block of a document per
    row (at most data.max_seq_length tokens), noised afresh every pass; the decoder reconstructs
    the block (targets = the original, decoder inputs = it shifted right behind
    data.decoder_start, default EOS as in fairseq and Hugging Face's BART).

    data.noise keys are fairseq's flags, defaulting to the one official BART pretraining command
    (fairseq#1899): mask 0.3 (share of *words* masked), mask_length "span-poisson" (text infilling;
    "word" or "subword": one word / token per span), poisson_lambda 3.5 (the paper says 3),
    replace_length 1 (one <mask> per span; 0 deletes the span, -1 masks every token of it),
    mask_random 0.1, permute_sentences 1.0, rotate 0.0 (fairseq's task default is 0.5: a trap),
    insert 0.0. Token masking is mask_length "subword" with replace_length 1, token deletion
    "subword" with 0. Sentences end at the tokenizer's "." token (fairseq: GPT-2's "."). A source
    that insertions make longer than the row keeps its first max_seq_length - 1 tokens and EOS.
    """

    start_token = "eos"

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        options = noise_options(cfg, dict(mask=0.3, mask_length="span-poisson", poisson_lambda=3.5, replace_length=1,
                                           mask_random=0.1, permute_sentences=1.0, rotate=0.0, insert=0.0))
        lengths = ("span-poisson", "word", "subword")
        if options["mask_length"] not in lengths:
            raise UserError(f"data.noise.mask_length={options['mask_length']!r} is unknown; use one of "
                            f"{', '.join(lengths)}")
        if options["replace_length"] not in (-1, 0, 1):
            raise UserError(f"data.noise.replace_length={options['replace_length']!r} is unknown; use -1, 0 or 1")
        self.options = options
        self.mask_id = _require_mask(tokenizer, "bart")
        self.full_stop = tokenizer.convert_tokens_to_ids(["."])[0]
        if options["permute_sentences"] > 0 and self.full_stop == tokenizer.unk_id:
            raise UserError("the tokenizer has no '.' token to end sentences at; set data.noise.permute_sentences=0")
        if options["mask_length"] == "subword":
            self.word_starts = np.ones(tokenizer.vocab_size, bool)
        else:
            self.word_starts = np.asarray(tokenizer.word_starts(np.arange(tokenizer.vocab_size)), bool)
        self.span_probs = (noising.poisson_span_probs(options["poisson_lambda"])
                           if options["mask_length"] == "span-poisson" else None)
        start = cfg.get("decoder_start")
        self.decoder_start = tokenizer.eos_id if start is None else start

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        return _document_rows(documents, self.cfg.max_seq_length, self.tokenizer)

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        o, length = self.options, self.cfg.max_seq_length
        targets = row_tokens(batch)
        inputs = []
        for tokens in targets:
            source = noising.bart_noise(
                tokens, self.word_starts, rng, mask_id=self.mask_id, vocab_size=self.tokenizer.vocab_size,
                full_stop=self.full_stop, mask=o["mask"], span_probs=self.span_probs,
                replace_length=o["replace_length"], mask_random=o["mask_random"], permute=o["permute_sentences"],
                rotate_prob=o["rotate"], insert=o["insert"])
            inputs.append(source if len(source) <= length else np.concatenate([source[: length - 1], source[-1:]]))
        return seq2seq_rows(inputs, targets, length, length, self.tokenizer.pad_id, self.decoder_start)


@register("mass")
class MassDenoising(Transform):
    """MASS's masked sequence-to-sequence rows (`noising.mass_noise`): one `<s> ... </s>` block of
    a document per row; a fragment of round(n·ratio) tokens is masked in the encoder input
    (80% <mask>, 10% random, 10% kept) and is the decoder's target. The decoder input is the
    fragment shifted right by one with the real token before it (so no data.decoder_start), and
    `decoder_positions` are the decoder inputs' positions in the block. Decoder rows hold
    ceil(max_seq_length / 2) tokens. data.noise: ratio 0.5, mask_prob 0.8, random_prob 0.1.
    MASS's decoder also ignores the encoder's <mask> positions in cross-attention
    (`enc_mask = x1 != mask_index`); that is the model's to do.
    """

    start_token = "eos"

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        self.options = noise_options(cfg, dict(ratio=0.5, mask_prob=0.8, random_prob=0.1))
        self.mask_id = _require_mask(tokenizer, "mass")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        return _document_rows(documents, self.cfg.max_seq_length, self.tokenizer)

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        length, pad = self.cfg.max_seq_length, self.tokenizer.pad_id
        examples = [noising.mass_noise(tokens, rng, mask_id=self.mask_id, vocab_size=self.tokenizer.vocab_size,
                                       **self.options) for tokens in row_tokens(batch)]
        fragment = (length + 1) // 2
        input_ids, input_mask = padded([e["inputs"] for e in examples], length, pad)
        decoder_ids, decoder_mask = padded([e["decoder_inputs"] for e in examples], fragment, pad)
        targets, _ = padded([e["targets"] for e in examples], fragment, pad)
        positions, _ = padded([e["positions"] for e in examples], fragment, 0)
        return {"input_ids": input_ids, "input_mask": input_mask, "decoder_input_ids": decoder_ids,
                "decoder_input_mask": decoder_mask, "decoder_positions": positions, "targets": targets,
                "target_weights": decoder_mask.astype(np.float32)}
