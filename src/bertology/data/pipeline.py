"""From tokenized documents to global training batches, deterministically.

The stream is a sequence of *passes* over the training documents. Pass p is built from
`(seed, p)` alone: instances (segment pairs) are created, shuffled, and — for static masking —
masked once. Static masking reuses pass p mod dupe_factor, so exactly dupe_factor differently
masked copies of the data exist, as in BERT's create_pretraining_data.py. Dynamic masking
(RoBERTa) builds fresh pairs each pass and draws fresh masks for each batch from `(seed, step)`.

The iterator state is three integers (pass, offset, step); it is saved with each checkpoint, so
a resumed run sees exactly the batches an uninterrupted run would. Every process computes the
same global batch order and keeps only its own rows.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data.embedded import DEFAULT_LEXICON
from bertology.data.examples import create_full_sentence_instances, create_pair_instances
from bertology.data import packing
from bertology.data.lexicon import LexiconMatcher
from bertology.data.masking import mask_tokens, mask_units
from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError

Batch = dict[str, np.ndarray]
Document = Sequence[np.ndarray]

# Stream ids keep the random streams of different purposes independent for the same seed.
_PAIRS, _SHUFFLE, _MASK, _EVAL = 1, 2, 3, 4


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


class Masker:
    """The config's masking (unit, rates, budget) bound to a tokenizer's special ids.

    data.mask_unit: token (BERT) | whole_word | ngram (ALBERT) | span (SpanBERT) | entity (ERNIE,
    with data.lexicon, default: a phrase list for the embedded corpus); data.mask_prob / data.random_prob: the 80/10/10 split (ELECTRA: 0.85/0).
    """

    def __init__(self, tokenizer: Tokenizer, cfg: ml_collections.ConfigDict):
        self.tokenizer = tokenizer
        self.unit = cfg.get("mask_unit", "token")
        self.lexicon = LexiconMatcher(cfg.get("lexicon") or DEFAULT_LEXICON, tokenizer) if self.unit == "entity" else None
        self.options = dict(
            vocab_size=tokenizer.vocab_size,
            mask_id=tokenizer.mask_id,
            special_ids=sorted({*tokenizer.special_ids, tokenizer.pad_id} - {tokenizer.unk_id}),  # BERT masks [UNK] too
            max_predictions=cfg.max_predictions_per_seq,
            masked_lm_prob=cfg.masked_lm_prob,
            mask_prob=cfg.get("mask_prob", 0.8),
            random_prob=cfg.get("random_prob", 0.1),
            pad_id=tokenizer.pad_id,
        )

    def __call__(self, input_ids: np.ndarray, rng: np.random.Generator) -> Batch:
        if self.unit == "token":
            return mask_tokens(input_ids, rng, **self.options)
        entities = [self.lexicon.spans(row) for row in input_ids] if self.unit == "entity" else None
        return mask_units(input_ids, rng, unit=self.unit, word_starts=self.tokenizer.word_starts(input_ids),
                          entity_spans=entities, **self.options)


def make_instances(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                   rng: np.random.Generator) -> Batch:
    """Unmasked instances of one pass: segment pairs with a sentence-pair label (BERT's NSP,
    ALBERT's SOP); with data.instances='full_sentences', RoBERTa's single-segment rows; with
    'packed', whole documents packed several per row (for model.attention_mask='packed')."""
    kind = cfg.get("instances", "pairs")
    if kind == "full_sentences":
        return create_full_sentence_instances(documents, max_seq_length=cfg.max_seq_length, cls_id=tokenizer.cls_id,
                                              sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id)
    if kind == "packed":  # whole documents, several per row, kept apart by packing_ids (model.attention_mask=packed)
        pieces = packing.document_pieces(documents, cfg.max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
        return packing.pack(pieces, cfg.max_seq_length, tokenizer.pad_id)
    task = cfg.get("sentence_task", "nsp")
    if task not in ("nsp", "sop"):
        raise UserError(f"data.sentence_task={task!r} is unknown; use 'nsp' (random next) or 'sop' (swapped order)")
    inst = create_pair_instances(
        documents,
        max_seq_length=cfg.max_seq_length,
        short_seq_prob=cfg.short_seq_prob,
        cls_id=tokenizer.cls_id,
        sep_id=tokenizer.sep_id,
        pad_id=tokenizer.pad_id,
        rng=rng,
        swap_for_negative=task == "sop",
    )
    return {
        "input_ids": inst.input_ids,
        "segment_ids": inst.segment_ids,
        "input_mask": inst.input_mask,
        "next_sentence_label": inst.next_sentence_label,
    }


class PretrainingStream:
    """Global batches of `batch_size` rows; this process gets rows [start, stop)."""

    def __init__(
        self,
        documents: Sequence[Document],
        tokenizer: Tokenizer,
        cfg: ml_collections.ConfigDict,
        *,
        batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if cfg.masking not in ("static", "dynamic"):
            raise UserError(f"data.masking={cfg.masking!r} is unknown; use 'static' or 'dynamic'")
        if batch_size % process_count:
            raise UserError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
        self.documents = documents
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.batch_size = batch_size
        self.seed = seed
        rows = batch_size // process_count
        self.rows = slice(process_index * rows, (process_index + 1) * rows)
        self.mask = Masker(tokenizer, cfg)
        self.state = {"pass": 0, "offset": 0, "step": 0}
        self._pass_id: int | None = None
        self._pass: Batch = {}

    def _build_pass(self, p: int) -> Batch:
        """Pass p: shuffled instances, masked now if masking is static."""
        static = self.cfg.masking == "static"
        source = p % self.cfg.dupe_factor if static else p
        inst = make_instances(self.documents, self.cfg, self.tokenizer, _rng(self.seed, _PAIRS, source))
        if len(inst["input_ids"]) == 0:
            raise UserError("the corpus produced no training instances; give it more text")
        order = _rng(self.seed, _SHUFFLE, source).permutation(len(inst["input_ids"]))
        inst = {k: v[order] for k, v in inst.items()}
        if static:
            inst.update(self.mask(inst["input_ids"], _rng(self.seed, _MASK, source)))
        return inst

    def _current_pass(self) -> Batch:
        if self._pass_id != self.state["pass"]:
            self._pass = self._build_pass(self.state["pass"])
            self._pass_id = self.state["pass"]
        return self._pass

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        parts: list[Batch] = []
        need = self.batch_size
        while need:
            inst = self._current_pass()
            n = len(inst["input_ids"])
            take = min(need, n - self.state["offset"])
            lo = self.state["offset"]
            parts.append({k: v[lo : lo + take] for k, v in inst.items()})
            need -= take
            self.state["offset"] += take
            if self.state["offset"] == n:
                self.state["pass"] += 1
                self.state["offset"] = 0
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if self.cfg.masking == "dynamic":
            batch.update(self.mask(batch["input_ids"], _rng(self.seed, _MASK, self.state["step"])))
        self.state["step"] += 1
        return {k: v[self.rows] for k, v in batch.items()}

    def get_state(self) -> dict[str, int]:
        return dict(self.state)

    def set_state(self, state: dict[str, int]) -> None:
        self.state = {k: int(state[k]) for k in ("pass", "offset", "step")}


def eval_batches(
    documents: Sequence[Document],
    tokenizer: Tokenizer,
    cfg: ml_collections.ConfigDict,
    *,
    batch_size: int,
    num_batches: int,
    seed: int,
) -> list[Batch]:
    """A fixed list of masked held-out batches, so eval numbers compare across steps and runs."""
    inst = make_instances(documents, cfg, tokenizer, _rng(seed, _EVAL, 0))
    n = len(inst["input_ids"])
    if n == 0:
        raise UserError("the validation split produced no instances; give the corpus more documents")
    idx = np.arange(batch_size * num_batches) % n
    inst = {k: v[idx] for k, v in inst.items()}
    inst.update(Masker(tokenizer, cfg)(inst["input_ids"], _rng(seed, _EVAL, 1)))
    return [{k: v[i * batch_size : (i + 1) * batch_size] for k, v in inst.items()} for i in range(num_batches)]
