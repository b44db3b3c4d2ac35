"""Data transforms: what one pretraining objective makes of the documents, keyed by data.objective.

`PretrainingStream` owns everything objectives share: passes, shuffling, resumption, per-process
rows. A transform owns what a row *is*: it turns one pass's documents into unmasked instances and,
where the objective needs it, corrupts them (MLM masking) once per pass (static) or per batch
(dynamic). Adding an objective is one `@register("name")` class; the stream does not change.

The registry. Shared objectives are here; an objective of one family lives in that family's
package, `families/<name>/data.py`, and registers itself when that module is imported. `lookup`
(and `make`, `registered`) import every family's `data` module once, on first use, so shared code
finds a family's transform by its data.objective alone, never by naming the family.

Transforms here:
- `mlm`: BERT-family rows (data.instances = pairs | sentence_pairs | full_sentences | doc_sentences | packed) with masked-LM
  corruption (data.masking = static | dynamic, data.mask_unit).
- `causal`: GPT's rows, documents packed several per row, next-token targets within each piece.
- `prefix_lm`: T5's prefix LM, one piece per row split at a random point.

In the families: `span_corruption` (t5), `bart` and `mass` (bart: MASS runs on BART's network),
`unilm` (unilm), `xlnet` (xlnet), and the contiguous ones (`data/lanes.py`) `bilm` (elmo) and
`contiguous_lm` (transfo_xl). The helpers they share are here: `seq2seq_rows`, `padded`,
`row_tokens`, `noise_options`, `next_token_targets`.

Encoder-decoder rows share one layout: encoder `input_ids`, `input_mask` [rows, Ls]; decoder
`decoder_input_ids`, `decoder_input_mask` [rows, Lt] (the targets shifted right behind
data.decoder_start, except MASS, see there), optional `decoder_positions`; loss `targets`,
`target_weights` [rows, Lt]. Ids and masks are int32, weights float32.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import ml_collections
import numpy as np

from bertology import families, validation
from bertology.data import packing
from bertology.data.embedded import DEFAULT_LEXICON, LEXICONS
from bertology.data.examples import create_full_sentence_instances, create_pair_instances, create_sentence_pair_instances
from bertology.data.lexicon import LexiconMatcher
from bertology.data.masking import mask_tokens, mask_units
from bertology.data.segmenter import SEGMENTERS, ChineseWords
from bertology.data.tokenizers import Tokenizer
from bertology.data.tokenizers.bytebpe import ByteLevelBPETokenizer
from bertology.errors import UserError

Batch = packing.Batch
Document = Sequence[np.ndarray]


class Transform:
    """One objective's rows. The stream calls `instances` once per pass with that pass's rng, then
    `corrupt` with a fresh rng: on the shuffled pass (reused for `copies` passes) or, when
    `per_batch`, on every batch. Evaluation calls `corrupt` once on its fixed instances.

    A `contiguous` transform (for a family that carries state across batches) instead has
    `instances(documents, rng, lanes)` return the pass as [lanes, steps, length, ...] arrays cut
    by `lanes.cut` from the documents as one stream, and is read by `lanes.LanesStream`, which
    corrupts every batch."""

    per_batch: bool = False  # corrupt each batch afresh (dynamic masking) instead of each pass
    copies: int | None = None  # distinct passes before pass p repeats pass p % copies; None: never
    contiguous: bool = False  # lanes of one token stream, row b of step t + 1 continuing row b of step t
    # The token a model pretrained on these rows starts decoding from unless data.decoder_start
    # says otherwise (`bertology.generation.decoder_start_id`): "eos" after fairseq's denoisers.
    start_token: str | None = None

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        self.cfg = cfg
        self.tokenizer = tokenizer

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        """One pass's rows, in a deterministic order the stream shuffles; `rng` is the pass's."""
        raise NotImplementedError

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        """The rows as the model sees them; objectives without corruption return them unchanged."""
        return batch

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """Refuse (`validation.refuse`) what this objective's rows cannot be made from; called by
        `validation.check` for the config's `data.objective` before anything is read."""


TRANSFORMS: dict[str, type[Transform]] = {}


def register(name: str) -> Callable[[type[Transform]], type[Transform]]:
    """Class decorator making a Transform available as data.objective=name."""

    def add(cls: type[Transform]) -> type[Transform]:
        if name in TRANSFORMS:
            raise ValueError(f"a data transform named {name!r} is already registered")
        TRANSFORMS[name] = cls
        return cls

    return add


def registered() -> dict[str, type[Transform]]:
    """Every transform by its data.objective name, the families' included (importing a family's
    `data` module runs its `@register`s)."""
    families.contributions("data")
    return dict(TRANSFORMS)


def lookup(name: str) -> type[Transform]:
    """The transform registered as data.objective=name; a UserError naming the known ones if none is."""
    known = registered()
    if name not in known:
        raise UserError(f"data.objective={name!r} is unknown; use one of {', '.join(sorted(known))}")
    return known[name]


def make(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> Transform:
    """The transform named by cfg.objective (the config's data block; default 'mlm')."""
    return lookup(cfg.get("objective", "mlm"))(cfg, tokenizer)


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


def _sentence_pairs(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                    rng: np.random.Generator) -> Batch:
    """RoBERTa's SENTENCE-PAIR+NSP rows: one natural sentence per segment."""
    inst = create_sentence_pair_instances(documents, max_seq_length=cfg.max_seq_length, cls_id=tokenizer.cls_id,
                                          sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id, rng=rng)
    return {"input_ids": inst.input_ids, "segment_ids": inst.segment_ids, "input_mask": inst.input_mask,
            "next_sentence_label": inst.next_sentence_label}


def _full_sentences(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                    rng: np.random.Generator, cross_documents: bool = True) -> Batch:
    """RoBERTa's FULL-SENTENCES rows, or DOC-SENTENCES without `cross_documents` (deterministic:
    `rng` is unused)."""
    return create_full_sentence_instances(documents, max_seq_length=cfg.max_seq_length, cls_id=tokenizer.cls_id,
                                          sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id,
                                          cross_documents=cross_documents)


def _packed(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
            rng: np.random.Generator) -> Batch:
    """Whole `[CLS] doc [SEP]` pieces several per row (the model keeps them apart by their packing ids; `rng` unused)."""
    pieces = packing.document_pieces(documents, cfg.max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
    return packing.pack(pieces, cfg.max_seq_length, tokenizer.pad_id)


_MLM_INSTANCES: dict[str, Callable[..., Batch]] = {
    "pairs": _pairs, "sentence_pairs": _sentence_pairs, "full_sentences": _full_sentences,
    "doc_sentences": functools.partial(_full_sentences, cross_documents=False), "packed": _packed,
}


@register("mlm")
class MaskedLM(Transform):
    """The BERT family's rows and masked-LM corruption.

    data.instances: pairs (BERT, ALBERT) | sentence_pairs | full_sentences (RoBERTa) | doc_sentences
    (RoBERTa's input-format ablation, Liu et al. 2019 §4.2) | packed; data.masking: static
    (BERT: `dupe_factor` differently masked copies of the data) | dynamic (RoBERTa: fresh masks every
    batch); data.mask_unit: token (BERT) | whole_word | ngram (ALBERT) | span (SpanBERT) | entity
    (ERNIE, with data.lexicon, default: a phrase list for the embedded corpus); data.word_segmenter:
    jieba (Chinese whole-word masking: words, not characters, for every unit but token); data.mask_prob /
    data.random_prob: the 80/10/10 split (ELECTRA: 0.85/0).
    """

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """A full row's masked predictions, round(masked_lm_prob · max_seq_length), must fit
        max_predictions_per_seq (validation's module docstring), unless
        `data.allow_capped_predictions` says the recipe caps them on purpose."""
        segmenter = validation.get(config, "data.word_segmenter")
        if segmenter not in (None, validation.MISSING):
            if segmenter not in SEGMENTERS:
                raise validation.refuse("data.word_segmenter", segmenter, "is unknown",
                                        f"use one of {', '.join(SEGMENTERS)} or leave it unset")
            if validation.get(config, "data.mask_unit") in ("token", validation.MISSING):
                raise validation.refuse("data.word_segmenter", segmenter, "finds words, but data.mask_unit='token' "
                                        "masks single tokens", "set --config.data.mask_unit=whole_word (or ngram, span)")
        keys = ("masked_lm_prob", "max_seq_length", "max_predictions_per_seq")
        rate, length, cap = (validation.get(config, f"data.{k}") for k in keys)
        if validation.MISSING in (rate, length, cap) or validation.get(config, "data.allow_capped_predictions") is True:
            return
        wanted = max(1, round(rate * length))
        if wanted > cap:
            raise validation.refuse(
                "data.masked_lm_prob", rate, f"asks for round({rate!r} * {length}) = {wanted} predictions per full "
                f"row of data.max_seq_length={length} but data.max_predictions_per_seq={cap} caps them",
                f"set --config.data.max_predictions_per_seq to at least {wanted} or lower --config.data.masked_lm_prob")

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
        if self.kind == "sentence_pairs" and task != "nsp":
            raise UserError(f"data.instances='sentence_pairs' makes NSP pairs, not {task!r}; set data.sentence_task='nsp'")
        self.unit = cfg.get("mask_unit", "token")

    @property
    def copies(self) -> int | None:  # read only when streaming, so instances need no masking keys
        return None if self.per_batch else self.cfg.dupe_factor

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        return _MLM_INSTANCES[self.kind](documents, self.cfg, self.tokenizer, rng)

    @functools.cached_property
    def mask_options(self) -> dict:
        """mask_tokens' keyword arguments; built on first use (instances alone need none of them).
        Public for subclasses that choose the positions their own way (UniLM's n-grams)."""
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
        lexicon = self.cfg.get("lexicon") or DEFAULT_LEXICON
        return LexiconMatcher(LEXICONS.get(lexicon, lexicon), self.tokenizer)

    @functools.cached_property
    def _word_starts(self) -> Callable[[np.ndarray], np.ndarray]:
        """The tokenizer's word starts, or with data.word_segmenter those of a segmenter for
        scripts written without spaces (Chinese whole-word masking)."""
        segmenter = self.cfg.get("word_segmenter")
        return ChineseWords(self.tokenizer, segmenter).word_starts if segmenter else self.tokenizer.word_starts

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        ids = batch["input_ids"]
        if self.unit == "token":
            masked = mask_tokens(ids, rng, **self.mask_options)
        else:
            entities = [self._lexicon.spans(row) for row in ids] if self.unit == "entity" else None
            masked = mask_units(ids, rng, unit=self.unit, word_starts=self._word_starts(ids),
                                entity_spans=entities, **self.mask_options)
        return {**batch, **masked}


def running_text(documents: Sequence[Document], tokenizer: Tokenizer) -> list[list[np.ndarray]]:
    """Each document's sentences as the tokens of running text: sentence "b" after "a" reads as
    the text "a b" would, not "ab".

    Why: preparation tokenizes sentence by sentence, and a byte-level BPE (GPT-2) keeps a word's
    leading space in its first token ("b" is "b", " b" is "Ġb"), so joining the sentences' ids
    would teach the model text with no space between sentences. GPT-2's pre-tokenizer splits
    before every space, so only a sentence's first pre-token changes: the tokens before its first
    word start are decoded and encoded again with a space in front. WordPiece and SentencePiece
    ids do not depend on that space (encode(" a") == encode("a")): their documents are kept."""
    if not isinstance(getattr(tokenizer, "base", tokenizer), ByteLevelBPETokenizer):  # `base`: under AddedTokens
        return [list(doc) for doc in documents]
    out = []
    for doc in documents:
        sentences = [np.asarray(s, np.int32) for s in doc if len(s)]
        for k in range(1, len(sentences)):
            s = sentences[k]
            starts = tokenizer.word_starts(s)
            if starts[0]:  # already spaced, or a special token
                continue
            later = np.flatnonzero(starts)
            head = s[: later[0] if len(later) else len(s)]
            spaced = tokenizer.encode(" " + tokenizer.decode(head.tolist()))
            sentences[k] = np.concatenate([np.asarray(spaced, np.int32), s[len(head):]])
        out.append(sentences)
    return out


@register("causal")
class CausalLM(Transform):
    """GPT's rows: each document is its sentences as running text (`running_text`) followed by
    `eos_id`, cut into pieces of at most data.max_seq_length tokens that overlap by one token
    (`packing.causal_pieces`: no target is lost at a cut), packed several per row best-fit-decreasing.

    Keys: input_ids, input_mask, positions (restarting in each piece), packing_ids (1, 2, ... per
    piece, 0 on padding: the model attends causally within a piece only), targets (the next token
    of the same piece) and target_weights (0 at each piece's last token and on padding). The rows
    are deterministic; the stream reshuffles them every pass. Needs a causal, packed attention mask.
    """

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        length = self.cfg.max_seq_length
        pieces = packing.causal_pieces(running_text(documents, self.tokenizer), length, self.tokenizer.eos_id)
        rows = packing.pack(pieces, length, self.tokenizer.pad_id)
        rows.update(next_token_targets(rows["input_ids"], rows["packing_ids"]))
        return rows


@register("prefix_lm")
class PrefixLM(Transform):
    """T5's prefix LM: one document piece per row (pieces as `causal`),
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


def padded(sequences: Sequence[np.ndarray], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`sequences` as int32 rows of `length` (each cut to it) and their int32 mask."""
    rows = packing.one_per_row([np.asarray(s[:length], np.int32) for s in sequences], length, pad_id)
    return rows["input_ids"], rows["input_mask"]


def seq2seq_rows(inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray], source_length: int,
                 target_length: int, pad_id: int, decoder_start: int) -> Batch:
    """The encoder-decoder batch of (input, target) sequences, cut to the row lengths: decoder
    inputs are the targets shifted right behind `decoder_start` (teacher forcing)."""
    input_ids, input_mask = padded(inputs, source_length, pad_id)
    target_ids, target_mask = padded(targets, target_length, pad_id)
    decoder_ids = np.full_like(target_ids, pad_id)
    decoder_ids[:, 0] = decoder_start
    decoder_ids[:, 1:] = target_ids[:, :-1]
    return {
        "input_ids": input_ids, "input_mask": input_mask,
        "decoder_input_ids": np.where(target_mask == 1, decoder_ids, pad_id).astype(np.int32),
        "decoder_input_mask": target_mask,
        "targets": target_ids, "target_weights": target_mask.astype(np.float32),
    }


def noise_options(cfg: ml_collections.ConfigDict, defaults: dict) -> dict:
    """data.noise over `defaults`; a key the objective does not know is a UserError."""
    given = ml_collections.ConfigDict(cfg.get("noise") or {}).to_dict()
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UserError(f"data.noise.{unknown[0]} does not apply to data.objective={cfg.get('objective')!r}; "
                        f"use {', '.join(defaults)}")
    return {**defaults, **given}


def row_tokens(batch: Batch) -> list[np.ndarray]:
    """Each row's real tokens (`input_ids` up to its `input_mask` count): the sequence a denoiser noises."""
    return [row[: n] for row, n in zip(batch["input_ids"], batch["input_mask"].sum(axis=1))]
