"""Data transforms: what one pretraining objective makes of the documents, keyed by data.objective.

`PretrainingStream` owns everything objectives share: passes, shuffling, resumption, per-process
rows. A transform owns what a row *is*: it turns one pass's documents into unmasked instances and,
where the objective needs it, corrupts them (MLM masking) once per pass (static) or per batch
(dynamic). Adding an objective (T5 span corruption, BART infilling, XLNet permutations) is one
`@register("name")` class here; the stream does not change.

Transforms here:
- `mlm`: BERT-family rows (data.instances = pairs | full_sentences | packed) with masked-LM
  corruption (data.masking = static | dynamic, data.mask_unit).
- `causal`: GPT's rows, documents packed several per row, next-token targets within each piece.
- `prefix_lm`: T5's prefix LM / UniLM's seq2seq rows, one piece per row split at a random point.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import ml_collections
import numpy as np

from bertology.data import packing
from bertology.data.embedded import DEFAULT_LEXICON
from bertology.data.examples import create_full_sentence_instances, create_pair_instances
from bertology.data.lexicon import LexiconMatcher
from bertology.data.masking import mask_tokens, mask_units
from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError

Batch = packing.Batch
Document = Sequence[np.ndarray]


class Transform:
    """One objective's rows. The stream calls `instances` once per pass with that pass's rng, then
    `corrupt` with a fresh rng: on the shuffled pass (reused for `copies` passes) or, when
    `per_batch`, on every batch. Evaluation calls `corrupt` once on its fixed instances."""

    per_batch: bool = False  # corrupt each batch afresh (dynamic masking) instead of each pass
    copies: int | None = None  # distinct passes before pass p repeats pass p % copies; None: never

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        self.cfg = cfg
        self.tokenizer = tokenizer

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        """One pass's rows, in a deterministic order the stream shuffles; `rng` is the pass's."""
        raise NotImplementedError

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        """The rows as the model sees them; objectives without corruption return them unchanged."""
        return batch


TRANSFORMS: dict[str, type[Transform]] = {}


def register(name: str) -> Callable[[type[Transform]], type[Transform]]:
    """Class decorator making a Transform available as data.objective=name."""

    def add(cls: type[Transform]) -> type[Transform]:
        if name in TRANSFORMS:
            raise ValueError(f"a data transform named {name!r} is already registered")
        TRANSFORMS[name] = cls
        return cls

    return add


def make(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> Transform:
    """The transform named by cfg.objective (the config's data block; default 'mlm')."""
    name = cfg.get("objective", "mlm")
    if name not in TRANSFORMS:
        raise UserError(f"data.objective={name!r} is unknown; use one of {', '.join(sorted(TRANSFORMS))}")
    return TRANSFORMS[name](cfg, tokenizer)


def next_token_targets(input_ids: np.ndarray, piece_ids: np.ndarray) -> Batch:
    """`targets[r, j] = input_ids[r, j + 1]` where position j + 1 is in the same piece (same
    nonzero `piece_ids`), with `target_weights` 1.0 there and 0.0 (target 0) at each piece's last
    token and at padding: a target never comes from another document."""
    following = np.zeros_like(input_ids)
    following[:, :-1] = input_ids[:, 1:]
    following_piece = np.zeros_like(piece_ids)
    following_piece[:, :-1] = piece_ids[:, 1:]
    weight = (piece_ids != 0) & (following_piece == piece_ids)
    return {"targets": np.where(weight, following, 0).astype(np.int32), "target_weights": weight.astype(np.float32)}


def _pairs(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
           rng: np.random.Generator) -> Batch:
    """Segment pairs with a sentence-pair label (BERT's NSP, ALBERT's SOP)."""
    inst = create_pair_instances(
        documents,
        max_seq_length=cfg.max_seq_length,
        short_seq_prob=cfg.short_seq_prob,
        cls_id=tokenizer.cls_id,
        sep_id=tokenizer.sep_id,
        pad_id=tokenizer.pad_id,
        rng=rng,
        swap_for_negative=cfg.get("sentence_task", "nsp") == "sop",
    )
    return {
        "input_ids": inst.input_ids,
        "segment_ids": inst.segment_ids,
        "input_mask": inst.input_mask,
        "next_sentence_label": inst.next_sentence_label,
    }


def _full_sentences(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                    rng: np.random.Generator) -> Batch:
    """RoBERTa's FULL-SENTENCES rows (deterministic: `rng` is unused)."""
    return create_full_sentence_instances(documents, max_seq_length=cfg.max_seq_length, cls_id=tokenizer.cls_id,
                                          sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id)


def _packed(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
            rng: np.random.Generator) -> Batch:
    """Whole `[CLS] doc [SEP]` pieces several per row (the model keeps them apart by their packing ids; `rng` unused)."""
    pieces = packing.document_pieces(documents, cfg.max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
    return packing.pack(pieces, cfg.max_seq_length, tokenizer.pad_id)


_MLM_INSTANCES: dict[str, Callable[..., Batch]] = {
    "pairs": _pairs, "full_sentences": _full_sentences, "packed": _packed,
}


@register("mlm")
class MaskedLM(Transform):
    """The BERT family's rows and masked-LM corruption.

    data.instances: pairs (BERT, ALBERT) | full_sentences (RoBERTa) | packed; data.masking: static
    (BERT: `dupe_factor` differently masked copies of the data) | dynamic (RoBERTa: fresh masks every
    batch); data.mask_unit: token (BERT) | whole_word | ngram (ALBERT) | span (SpanBERT) | entity
    (ERNIE, with data.lexicon, default: a phrase list for the embedded corpus); data.mask_prob /
    data.random_prob: the 80/10/10 split (ELECTRA: 0.85/0).
    """

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        masking = cfg.get("masking", "static")
        if masking not in ("static", "dynamic"):
            raise UserError(f"data.masking={masking!r} is unknown; use 'static' or 'dynamic'")
        self.per_batch = masking == "dynamic"
        self.kind = cfg.get("instances", "pairs")
        if self.kind not in _MLM_INSTANCES:
            raise UserError(f"data.instances={self.kind!r} is unknown; use one of {', '.join(_MLM_INSTANCES)}")
        task = cfg.get("sentence_task", "nsp")
        if self.kind == "pairs" and task not in ("nsp", "sop"):
            raise UserError(f"data.sentence_task={task!r} is unknown; use 'nsp' (random next) or 'sop' (swapped order)")
        self.unit = cfg.get("mask_unit", "token")

    @property
    def copies(self) -> int | None:  # read only when streaming, so instances need no masking keys
        return None if self.per_batch else self.cfg.dupe_factor

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        return _MLM_INSTANCES[self.kind](documents, self.cfg, self.tokenizer, rng)

    @functools.cached_property
    def _options(self) -> dict:
        """mask_tokens' keyword arguments; built on first use (instances alone need none of them)."""
        tok, cfg = self.tokenizer, self.cfg
        if tok.mask_id is None:
            raise UserError("the tokenizer has no mask token (a GPT-2 byte-level BPE); masked-LM data needs one: "
                            "train one with `python -m bertology.tokenizer --kind bytebpe --specials roberta`")
        return dict(
            vocab_size=tok.vocab_size,
            mask_id=tok.mask_id,
            special_ids=sorted({*tok.special_ids, tok.pad_id} - {tok.unk_id}),  # BERT masks [UNK] too
            max_predictions=cfg.max_predictions_per_seq,
            masked_lm_prob=cfg.masked_lm_prob,
            mask_prob=cfg.get("mask_prob", 0.8),
            random_prob=cfg.get("random_prob", 0.1),
            pad_id=tok.pad_id,
        )

    @functools.cached_property
    def _lexicon(self) -> LexiconMatcher:
        return LexiconMatcher(self.cfg.get("lexicon") or DEFAULT_LEXICON, self.tokenizer)

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        ids = batch["input_ids"]
        if self.unit == "token":
            masked = mask_tokens(ids, rng, **self._options)
        else:
            entities = [self._lexicon.spans(row) for row in ids] if self.unit == "entity" else None
            masked = mask_units(ids, rng, unit=self.unit, word_starts=self.tokenizer.word_starts(ids),
                                entity_spans=entities, **self._options)
        return {**batch, **masked}


@register("causal")
class CausalLM(Transform):
    """GPT's rows: each document is its sentences followed by `eos_id`, cut into pieces of at most
    data.max_seq_length tokens that overlap by one token (`packing.causal_pieces`: no target is
    lost at a cut), packed several per row best-fit-decreasing.

    Keys: input_ids, input_mask, positions (restarting in each piece), packing_ids (1, 2, ... per
    piece, 0 on padding: the model attends causally within a piece only), targets (the next token
    of the same piece) and target_weights (0 at each piece's last token and on padding). The rows
    are deterministic; the stream reshuffles them every pass. Needs a causal, packed attention mask.
    """

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        length = self.cfg.max_seq_length
        pieces = packing.causal_pieces(documents, length, self.tokenizer.eos_id)
        rows = packing.pack(pieces, length, self.tokenizer.pad_id)
        rows.update(next_token_targets(rows["input_ids"], rows["packing_ids"]))
        return rows


@register("prefix_lm")
class PrefixLM(Transform):
    """T5's prefix LM (UniLM's seq2seq rows): one document piece per row (pieces as `causal`),
    split at a point drawn uniformly from 1 ... n-1 for a piece of n tokens, so every row has a
    prefix and at least one target. The model attends bidirectionally inside the first
    `prefix_length` tokens and causally after them; targets are the tokens after the prefix (the
    token at prefix_length - 1 predicts the first).

    Keys: input_ids, input_mask, positions, targets, target_weights, prefix_length [rows]. Splits
    are drawn from the pass's rng, so every pass splits the pieces afresh.
    """

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        length = self.cfg.max_seq_length
        pieces = packing.causal_pieces(documents, length, self.tokenizer.eos_id)
        rows = packing.one_per_row(pieces, length, self.tokenizer.pad_id)
        del rows["packing_ids"]
        n = rows["input_mask"].sum(axis=1)
        prefix = rng.integers(1, n) if len(n) else np.zeros(0, np.int64)  # uniform on 1 ... n-1
        rows.update(next_token_targets(rows["input_ids"], rows["input_mask"]))
        after = np.arange(length) >= prefix[:, None] - 1
        rows["targets"] = np.where(after, rows["targets"], 0)
        rows["target_weights"] = np.where(after, rows["target_weights"], 0.0).astype(np.float32)
        rows["prefix_length"] = prefix.astype(np.int32)
        return rows
