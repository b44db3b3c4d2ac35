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
- `prefix_lm`: T5's prefix LM, one piece per row split at a random point.
- `unilm`: UniLM's mixed rows (bidirectional, left-to-right, right-to-left, sequence-to-sequence
  in one batch) with n-gram masked-LM corruption.
- `span_corruption`, `bart`, `mass`: encoder-decoder denoising (T5 and its objective table, BART,
  MASS) with the rules of `noising.py`.
- `bilm`, `contiguous_lm`, `xlnet` (contiguous, `data/lanes.py`): ELMo's forward and backward
  word streams, Transformer-XL's token stream, and XLNet's [reuse | A <sep> B <sep> <cls>] rows with
  permutation masks (`permutation.py`), each as lanes that recurrent state carries across.

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

from bertology import validation
from bertology.data import lanes, masking, noising, packing, permutation, words
from bertology.data.embedded import DEFAULT_LEXICON
from bertology.data.examples import create_full_sentence_instances, create_pair_instances
from bertology.data.lexicon import LexiconMatcher
from bertology.data.masking import mask_tokens, mask_units
from bertology.data.tokenizers import Tokenizer
from bertology.data.tokenizers.bytebpe import ByteLevelBPETokenizer
from bertology.errors import UserError
from bertology.models.transformer import Mask

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

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """A full row's masked predictions, round(masked_lm_prob · max_seq_length), must fit
        max_predictions_per_seq (validation's module docstring), unless
        `data.allow_capped_predictions` says the recipe caps them on purpose."""
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


def _padded(sequences: Sequence[np.ndarray], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`sequences` as int32 rows of `length` (each cut to it) and their int32 mask."""
    rows = packing.one_per_row([np.asarray(s[:length], np.int32) for s in sequences], length, pad_id)
    return rows["input_ids"], rows["input_mask"]


def seq2seq_rows(inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray], source_length: int,
                 target_length: int, pad_id: int, decoder_start: int) -> Batch:
    """The encoder-decoder batch of (input, target) sequences, cut to the row lengths: decoder
    inputs are the targets shifted right behind `decoder_start` (teacher forcing)."""
    input_ids, input_mask = _padded(inputs, source_length, pad_id)
    target_ids, target_mask = _padded(targets, target_length, pad_id)
    decoder_ids = np.full_like(target_ids, pad_id)
    decoder_ids[:, 0] = decoder_start
    decoder_ids[:, 1:] = target_ids[:, :-1]
    return {
        "input_ids": input_ids, "input_mask": input_mask,
        "decoder_input_ids": np.where(target_mask == 1, decoder_ids, pad_id).astype(np.int32),
        "decoder_input_mask": target_mask,
        "targets": target_ids, "target_weights": target_mask.astype(np.float32),
    }


def _noise_options(cfg: ml_collections.ConfigDict, defaults: dict) -> dict:
    """data.noise over `defaults`; a key the objective does not know is a UserError."""
    given = ml_collections.ConfigDict(cfg.get("noise") or {}).to_dict()
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UserError(f"data.noise.{unknown[0]} does not apply to data.objective={cfg.get('objective')!r}; "
                        f"use {', '.join(defaults)}")
    return {**defaults, **given}


def _document_rows(documents: Sequence[Document], length: int, tokenizer: Tokenizer) -> Batch:
    """One `<s> ... </s>` piece of a document per row (BART's and MASS's sentences-to-document
    blocks): [CLS]/<s> in front, EOS at the end, at most `length` tokens."""
    pieces = packing.document_pieces(documents, length, tokenizer.cls_id, tokenizer.eos_id)
    rows = packing.one_per_row(pieces, length, tokenizer.pad_id)
    return {"input_ids": rows["input_ids"], "input_mask": rows["input_mask"]}


def _tokens(batch: Batch) -> list[np.ndarray]:
    return [row[: n] for row, n in zip(batch["input_ids"], batch["input_mask"].sum(axis=1))]


def _require_mask(tokenizer: Tokenizer, objective: str) -> int:
    if tokenizer.mask_id is None:
        raise UserError(f"data.objective={objective!r} needs a <mask> token and the tokenizer has none; "
                        "load it with load_tokenizer(..., add_mask=True)")
    return tokenizer.mask_id


# data.noise.kind -> (noise mask, inputs, default targets, default density): the rows of the T5
# paper's objective table (section 3.3; gin names in the docstring of SpanCorruption).
T5_KINDS = {
    "spans": ("spans", "sentinels", "sentinels", 0.15),
    "iid": ("iid", "sentinels", "sentinels", 0.15),
    "bert": ("iid", "random_or_sentinel", "full", 0.15),
    "mass_style": ("iid", "sentinel", "full", 0.15),
    "drop": ("iid", "drop", "noise", 0.15),
    "deshuffle": ("iid", "permute", "full", 1.0),
    "prefix_lm": ("prefix", "prefix", "kept", 0.5),
}
T5_TARGETS = ("sentinels", "full", "noise", "kept")
_SENTINEL = "<extra_id_0>"


@register("span_corruption")
class SpanCorruption(Transform):
    """T5's denoising objectives (`t5.data.preprocessors.denoise`), one per data.noise.kind:

    | kind | T5 gin | noise mask | encoder input | decoder target |
    | spans (default) | span_{2,3,5,10}_15_u_u | random spans | a sentinel per span | sentinel, span, ... |
    | iid | iid_15_u_u (replace spans) | i.i.d. | a sentinel per run | as spans |
    | bert | iid_15_r10s90_f | i.i.d. | 10% random id, 90% the sentinel | the full chunk |
    | mass_style | iid_15_m_f | i.i.d. | the sentinel per token | the full chunk |
    | drop | iid_15_d_d | i.i.d. | noise dropped | the noise only |
    | deshuffle | all_permute | i.i.d., density 1 | tokens shuffled | the full chunk |
    | prefix_lm | prefix_lm | a prefix of 1 ... L-1 tokens (density 0.5) | the prefix | the rest |

    data.noise: kind, density (0.15; deshuffle 1.0, prefix_lm 0.5), mean_span (3.0, spans only),
    targets (sentinels | full | noise | kept: overrides the kind's), random_prob (0.1, bert).
    Sentinels come from the top of the vocabulary down (`<extra_id_0>` = vocab_size - 1), so the
    tokenizer must have them there (`load_tokenizer(..., extra_ids=100)`).

    Rows follow T5's pipeline: each pass shuffles the documents, concatenates their tokens (no
    separator, as `reduce_concat_tokens`) and splits them into raw chunks; every chunk is
    corrupted and EOS appended to inputs and targets. For `spans` the chunk length comes from
    `random_spans_lengths`, so full chunks give exactly data.max_seq_length encoder tokens and
    the decoder rows are the helper's targets length (512 -> 568 raw / 114 targets); other
    kinds use chunks of max_seq_length - 1 and decoder rows of max_seq_length.
    data.max_target_length cuts the decoder rows shorter (T5's trim). Decoder inputs start with
    data.decoder_start (default the pad id: T5 starts with 0 = pad).
    """

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        options = _noise_options(cfg, dict(kind="spans", density=None, mean_span=3.0, targets=None, random_prob=0.1))
        if options["kind"] not in T5_KINDS:
            raise UserError(f"data.noise.kind={options['kind']!r} is unknown; use one of {', '.join(T5_KINDS)}")
        self.mask, self.inputs, targets, density = T5_KINDS[options["kind"]]
        self.targets = options["targets"] or targets
        if self.targets not in T5_TARGETS:
            raise UserError(f"data.noise.targets={self.targets!r} is unknown; use one of {', '.join(T5_TARGETS)}")
        self.density = density if options["density"] is None else float(options["density"])
        self.mean_span, self.random_prob = float(options["mean_span"]), float(options["random_prob"])
        length = cfg.max_seq_length
        if self.mask == "spans":
            self.raw_length, target_length = noising.random_spans_lengths(length, self.density, self.mean_span)
        else:
            self.raw_length, target_length = length - 1, length
        self.target_length = cfg.get("max_target_length") or target_length
        start = cfg.get("decoder_start")
        self.decoder_start = tokenizer.pad_id if start is None else start
        if "sentinel" in self.inputs + self.targets:
            top = tokenizer.convert_ids_to_tokens([tokenizer.vocab_size - 1])[0]
            if top != _SENTINEL:
                raise UserError(f"T5 noising needs the sentinel {_SENTINEL} as the last id of the vocabulary "
                                f"but it is {top!r}; load the tokenizer with load_tokenizer(..., extra_ids=100)")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        order = rng.permutation(len(documents))
        tokens = [np.asarray(s, np.int32) for i in order for s in documents[i]]
        tokens = np.concatenate(tokens) if tokens else np.zeros(0, np.int32)
        chunks = [tokens[at : at + self.raw_length] for at in range(0, len(tokens), self.raw_length)]
        ids, mask = _padded([c for c in chunks if len(c) >= 2], self.raw_length, self.tokenizer.pad_id)
        return {"input_ids": ids, "input_mask": mask}

    def _noise_mask(self, length: int, rng: np.random.Generator) -> np.ndarray:
        if self.mask == "spans":
            return noising.random_spans_noise_mask(length, self.density, self.mean_span, rng)
        if self.mask == "iid":
            return noising.iid_noise_mask(length, self.density, rng)
        return noising.random_prefix_noise_mask(length, self.density, rng)

    def _inputs(self, tokens: np.ndarray, noise: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        vocab = self.tokenizer.vocab_size
        return {
            "sentinels": lambda: noising.noise_span_to_unique_sentinel(tokens, noise, vocab),
            "random_or_sentinel": lambda: noising.noise_token_to_random_token_or_sentinel(
                tokens, noise, vocab, rng, self.random_prob),
            "sentinel": lambda: noising.noise_token_to_sentinel(tokens, noise, vocab),
            "drop": lambda: noising.drop_noise_tokens(tokens, noise),
            "permute": lambda: noising.permute_noise_tokens(tokens, noise, rng),
            "prefix": lambda: noising.drop_nonnoise_tokens(tokens, noise),
        }[self.inputs]()

    def _targets(self, tokens: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return {
            "sentinels": lambda: noising.nonnoise_span_to_unique_sentinel(tokens, noise, self.tokenizer.vocab_size),
            "full": lambda: tokens,
            "noise": lambda: noising.drop_nonnoise_tokens(tokens, noise),
            "kept": lambda: noising.drop_noise_tokens(tokens, noise),
        }[self.targets]()

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        eos = [self.tokenizer.eos_id]
        inputs, targets = [], []
        for tokens in _tokens(batch):
            noise = self._noise_mask(len(tokens), rng)
            inputs.append(np.concatenate([self._inputs(tokens, noise, rng), eos]))
            targets.append(np.concatenate([self._targets(tokens, noise), eos]))
        return seq2seq_rows(inputs, targets, self.cfg.max_seq_length, self.target_length, self.tokenizer.pad_id,
                            self.decoder_start)


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
        options = _noise_options(cfg, dict(mask=0.3, mask_length="span-poisson", poisson_lambda=3.5, replace_length=1,
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
        targets = _tokens(batch)
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
        self.options = _noise_options(cfg, dict(ratio=0.5, mask_prob=0.8, random_prob=0.1))
        self.mask_id = _require_mask(tokenizer, "mass")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        return _document_rows(documents, self.cfg.max_seq_length, self.tokenizer)

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        length, pad = self.cfg.max_seq_length, self.tokenizer.pad_id
        examples = [noising.mass_noise(tokens, rng, mask_id=self.mask_id, vocab_size=self.tokenizer.vocab_size,
                                       **self.options) for tokens in _tokens(batch)]
        fragment = (length + 1) // 2
        input_ids, input_mask = _padded([e["inputs"] for e in examples], length, pad)
        decoder_ids, decoder_mask = _padded([e["decoder_inputs"] for e in examples], fragment, pad)
        targets, _ = _padded([e["targets"] for e in examples], fragment, pad)
        positions, _ = _padded([e["positions"] for e in examples], fragment, 0)
        return {"input_ids": input_ids, "input_mask": input_mask, "decoder_input_ids": decoder_ids,
                "decoder_input_mask": decoder_mask, "decoder_positions": positions, "targets": targets,
                "target_weights": decoder_mask.astype(np.float32)}


# unilm-v1 `--new_segment_ids` (run_seq2seq.py, type_vocab_size 6): each kind's (first, second)
# segment id, so the segment embedding also tells the network which LM a row is.
UNILM_SEGMENTS = {"bidirectional": (0, 1), "left_to_right": (2, 2), "right_to_left": (3, 3), "seq2seq": (4, 5)}
# The paper's mix per batch (section 2.3): 1/3 bidirectional, 1/3 seq2seq, 1/6 each direction.
UNILM_MIX = {"bidirectional": 1 / 3, "left_to_right": 1 / 6, "right_to_left": 1 / 6, "seq2seq": 1 / 3}


def mask_kind_counts(rows: int, shares: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """How many of `rows` rows get each kind: floor(rows · share) or one more, the extra rows
    going to kind k with probability equal to its fractional part (systematic sampling), so
    every batch is as close to the shares as whole rows allow and each kind's expected count is
    exactly rows · share (a 32-row batch is not a multiple of 6)."""
    exact = rows * np.asarray(shares, np.float64) / np.sum(shares)
    counts = np.floor(exact).astype(np.int64)
    edges = np.concatenate([[0.0], np.cumsum(exact - counts)])
    edges[-1] = rows - counts.sum()  # an integer; exact against rounding
    u = rng.random()  # the extra rows sit at u, u + 1, ...: kind k gets those in (edges[k], edges[k + 1]]
    return counts + (np.floor(edges[1:] - u) - np.floor(edges[:-1] - u)).astype(np.int64)


def unilm_ngrams(candidate: np.ndarray, budget: np.ndarray, max_predictions: int, rng: np.random.Generator,
                 ngram_prob: float, max_ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """UniLM's choice of masked positions (unilm-v1 `skipgram_prb`/`skipgram_size`): start
    positions in random order; from each, with probability `ngram_prob` an n-gram of n uniform in
    2 ... max_ngram tokens, else one token; an n-gram stops at a non-candidate token or when the
    row's `budget` is reached. Returns ascending [rows, max_predictions] positions (0-padded) and
    their weights, as `masking.mask_tokens` does."""
    rows, length = candidate.shape
    positions = np.full((rows, max_predictions), length, np.int64)
    for r in range(rows):
        chosen: list[int] = []
        taken = np.zeros(length, bool)
        for start in rng.permutation(np.flatnonzero(candidate[r])):
            if len(chosen) >= budget[r]:
                break
            n = int(rng.integers(2, max_ngram + 1)) if rng.random() < ngram_prob else 1
            for p in range(start, min(start + n, length)):
                if not candidate[r, p] or len(chosen) >= budget[r]:
                    break
                if not taken[p]:
                    taken[p] = True
                    chosen.append(p)
        positions[r, : len(chosen)] = np.sort(chosen)
    weights = positions < length
    return np.where(weights, positions, 0).astype(np.int32), weights


@register("unilm")
class UniLMRows(MaskedLM):
    """UniLM's rows (Dong et al. 2019): BERT's segment pairs `[CLS] A [SEP] B [SEP]` where B
    always follows A (no NSP), each batch split among the four mask kinds by data.noise shares
    (default `UNILM_MIX`), masked afresh every batch (data.masking must be dynamic).

    Per row: `mask_kind` (an index into `Mask.KINDS`), `segment_ids` per `UNILM_SEGMENTS`, and
    for sequence-to-sequence rows `prefix_length` = |A| + 2 (A is the source, B the target;
    0 on other rows). Masking takes BERT's budget (data.masked_lm_prob of the tokens, at most
    data.max_predictions_per_seq) over both segments of every kind, as the paper pretrains,
    choosing n-grams by `unilm_ngrams` (data.noise.ngram_prob 0.2, max_ngram 3: the paper's
    "20% of the time a bigram or a trigram") and corrupting them 80/10/10 (data.mask_prob,
    data.random_prob). The loss is the MLM loss at the masked positions, each under its row's mask.
    """

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        if not self.per_batch:
            raise UserError("data.objective='unilm' draws mask kinds and masks for every batch; "
                            "set data.masking=dynamic")
        options = _noise_options(cfg, {**UNILM_MIX, "ngram_prob": 0.2, "max_ngram": 3})
        self.shares = [float(options[k]) for k in Mask.KINDS]
        if min(self.shares) < 0 or sum(self.shares) <= 0:
            raise UserError(f"data.noise mask-kind shares {dict(zip(Mask.KINDS, self.shares))} must be >= 0 with a "
                            "positive sum; e.g. the paper's 1/3, 1/6, 1/6, 1/3")
        self.ngram_prob, self.max_ngram = float(options["ngram_prob"]), int(options["max_ngram"])
        if not 0 <= self.ngram_prob <= 1 or self.max_ngram < 2:
            raise UserError(f"data.noise.ngram_prob={self.ngram_prob} / max_ngram={self.max_ngram}: use a probability "
                            "and an n-gram length of at least 2 (the paper: 0.2 and 3)")

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        tok = self.tokenizer
        inst = create_pair_instances(documents, max_seq_length=self.cfg.max_seq_length,
                                     short_seq_prob=self.cfg.short_seq_prob, cls_id=tok.cls_id, sep_id=tok.sep_id,
                                     pad_id=tok.pad_id, rng=rng, nsp=False)
        return {"input_ids": inst.input_ids, "segment_ids": inst.segment_ids, "input_mask": inst.input_mask}

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        o = self._options
        ids, special, candidate, budget = masking._prepare(
            batch["input_ids"], o["special_ids"], o["vocab_size"], o["max_predictions"], o["masked_lm_prob"],
            o["mask_prob"], o["random_prob"], o["pad_id"])
        positions, weights = unilm_ngrams(candidate, budget, o["max_predictions"], rng, self.ngram_prob,
                                          self.max_ngram)
        masked = masking._corrupt(ids, positions, weights, rng, vocab_size=o["vocab_size"], mask_id=o["mask_id"],
                                  special=special, mask_prob=o["mask_prob"], random_prob=o["random_prob"])
        rows = len(ids)
        kinds = rng.permutation(np.repeat(np.arange(len(Mask.KINDS)), mask_kind_counts(rows, self.shares, rng)))
        second = batch["segment_ids"] > 0
        first_ids = np.array([UNILM_SEGMENTS[k][0] for k in Mask.KINDS])[kinds][:, None]
        second_ids = np.array([UNILM_SEGMENTS[k][1] for k in Mask.KINDS])[kinds][:, None]
        segments = np.where(second, second_ids, first_ids) * (batch["input_mask"] > 0)
        source = np.count_nonzero((batch["input_mask"] > 0) & ~second, axis=1)
        seq2seq = kinds == Mask.KINDS.index("seq2seq")
        return {**batch, **masked, "segment_ids": segments.astype(np.int32), "mask_kind": kinds.astype(np.int32),
                "prefix_length": np.where(seq2seq, source, 0).astype(np.int32)}


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
        tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
        missing = [t for t in (words.BOS, words.EOS) if t not in tokens]
        if missing:
            raise UserError(f"data.objective='bilm' needs a word vocabulary with {' and '.join(missing)}; "
                            "build one with bertology.data.words.build_word_vocab")
        self.bos_id, self.eos_id = tokens.index(words.BOS), tokens.index(words.EOS)
        self.chars = words.char_id_table(tokens, cfg.get("max_characters_per_token", 50))

    def instances(self, documents: Sequence[Document], rng: np.random.Generator, lanes_: int) -> Batch:
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


@register("xlnet")
class XLNetRows(Transform):
    """XLNet's pretraining rows (zihangdai/xlnet `data_utils.py`, rules in `data/permutation.py`).

    Contiguous: `instances(documents, rng, lanes)` returns arrays [lanes, steps, ...]. The corpus is
    one token stream (documents in order, sentences alternating sentence ids, the tokenizer's eos
    ending each document inside its last sentence, as the reference's `<eod>` with use_eod) cut into
    lanes (`batchify`). Step t of a lane is `lane[t·R : (t+1)·R]` (R = data.reuse_len: the part the
    model caches as memory, so step t+1's reused part continues step t's) followed by A `<sep>` B
    `<sep>` `<cls>` (`permutation.split_a_and_b`, A starting at `lane[(t+1)·R]`), data.max_seq_length
    tokens in all, no padding; segment ids 0 up to the first `<sep>`, 1 up to the second, 2 on `<cls>`.
    A lane ends at the first step where any lane runs out of text, as the reference cuts its batches.

    data.bi_data (default True, the reference's): the stream is cut into lanes/2 lanes and rows
    lanes/2 + b are lane b reversed (the reference puts forward and reversed lanes in the two halves
    of each core's batch; here the halves of the global batch: row b < lanes/2 is forward). Spans on
    a reversed lane are drawn on it read forwards (the reference's `reverse=True`), so they still
    start at word starts. The model negates the relative positions of the second half.

    Targets (`permutation.span_targets`, data.mask_alpha K = 6, data.mask_beta 1, data.num_predict
    = max_seq_length·beta/alpha, 85 at 512) are drawn once per pass and kept as `is_masked`:
    ceil(P/2) in the reused part, floor(P/2) in the rest. `corrupt` (every batch, as the reference's
    input parser draws the factorisation order on every read) turns them into perm_mask [L, L] int8
    (1 = may NOT attend; `permutation.row_perm_mask`, data.perm_size, default R), target_mapping
    [P, L] float32, targets [P] (the token itself at each target) and target_weights [P] float32
    (0 on padding rows); it drops `is_masked`. Keys as the model reads them: input_ids,
    segment_ids, input_mask (1 = real token: all ones), perm_mask, target_mapping, targets,
    target_weights, carry_reset [lanes, steps] int32 (1 on every lane's first step of the pass).
    """

    contiguous = True
    per_batch = True

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """The rows must fit their parts (`permutation.Settings`, keys defaulted as `__init__`
        defaults them)."""
        o = permutation.Settings.from_config(config.data)
        rest = o.seq_len - o.reuse_len
        if o.reuse_len >= o.seq_len - 3:
            raise validation.refuse("data.reuse_len", o.reuse_len, f"leaves no room for A <sep> B <sep> <cls> in "
                                    f"data.max_seq_length={o.seq_len}",
                                    f"use reuse_len < {o.seq_len - 3} (the reference: half the row)")
        if o.reuse_len % o.perm_size or rest % o.perm_size:
            raise validation.refuse("data.perm_size", o.perm_size, f"does not divide both data.reuse_len="
                                    f"{o.reuse_len} and the {rest} tokens after it",
                                    "use a common divisor of the two (the reference: reuse_len)")
        if o.predict_in_reuse > o.reuse_len or o.num_predict - o.predict_in_reuse > rest:
            raise validation.refuse("data.num_predict", o.num_predict, f"does not fit: half of it is predicted in "
                                    f"the {o.reuse_len} reused tokens and half in the {rest} after them",
                                    f"use at most {2 * min(o.reuse_len, rest)} (the reference: seq_len / 6)")
        if o.mask_alpha < o.mask_beta:
            raise validation.refuse("data.mask_alpha", o.mask_alpha, f"is below data.mask_beta={o.mask_beta}",
                                    "use mask_alpha >= mask_beta (the reference: 6 and 1)")
        for key in ("batch_size", "eval_batch_size"):
            value = validation.get(config, key)
            if o.bi_data and value is not validation.MISSING and value % 2:
                raise validation.refuse(key, value, "is odd and data.bi_data puts reversed copies of the lanes in "
                                        "half the batch", "use an even batch size or set data.bi_data=False")

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        self.settings = permutation.Settings.from_config(cfg)
        self.word_starts = np.asarray(tokenizer.word_starts(np.arange(tokenizer.vocab_size)), bool)
        self.functional = np.array([tokenizer.sep_id, tokenizer.cls_id])

    def _stream(self, documents: Sequence[Document]) -> tuple[np.ndarray, np.ndarray]:
        """The corpus as one token stream and its alternating sentence ids."""
        tokens: list[np.ndarray] = []
        ids: list[np.ndarray] = []
        for doc in documents:
            sentences = [np.asarray(s, np.int64) for s in doc if len(s)]
            if sentences:
                sentences[-1] = np.append(sentences[-1], self.tokenizer.eos_id)
            for s in sentences:
                ids.append(np.full(len(s), len(tokens) % 2, np.int8))
                tokens.append(s)
        if not tokens:
            return np.zeros(0, np.int64), np.zeros(0, np.int8)
        return np.concatenate(tokens), np.concatenate(ids)

    def _targets(self, segment: np.ndarray, count: int, reverse: bool, rng: np.random.Generator) -> np.ndarray:
        starts = self.word_starts[segment]
        chosen = permutation.span_targets(starts[::-1] if reverse else starts, rng, num_predict=count,
                                          alpha=self.settings.mask_alpha, beta=self.settings.mask_beta)
        return chosen[::-1] if reverse else chosen

    def instances(self, documents: Sequence[Document], rng: np.random.Generator, lanes: int) -> Batch:
        o = self.settings
        if o.bi_data and lanes % 2:
            raise UserError(f"data.bi_data puts reversed copies in half the batch; batch_size={lanes} is odd: "
                            "use an even batch_size or set data.bi_data=False")
        length, reuse, tok = o.seq_len, o.reuse_len, self.tokenizer
        stream, sent = self._stream(documents)
        forward = lanes // 2 if o.bi_data else lanes
        per_lane = len(stream) // forward
        data = stream[: forward * per_lane].reshape(forward, per_lane)
        sent = sent[: forward * per_lane].reshape(forward, per_lane)
        if o.bi_data:
            data, sent = np.concatenate([data, data[:, ::-1]]), np.concatenate([sent, sent[:, ::-1]])
        tail = np.array([tok.sep_id, tok.cls_id])
        steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        start = 0
        while start + length <= per_lane:
            rows = []
            for b in range(lanes):
                split = permutation.split_a_and_b(data[b], sent[b], start + reuse, length - reuse - 3, rng)
                if split is None:
                    break
                a, bb, _ = split
                reverse = o.bi_data and b >= forward
                rest = np.concatenate([a, tail[:1], bb, tail])
                masked = np.concatenate([self._targets(data[b, start:start + reuse], o.predict_in_reuse, reverse, rng),
                                         self._targets(rest, o.num_predict - o.predict_in_reuse, reverse, rng)])
                segments = np.concatenate([np.zeros(reuse + len(a) + 1), np.ones(len(bb) + 1), [2]])
                rows.append((np.concatenate([data[b, start:start + reuse], rest]), segments, masked))
            if len(rows) < lanes:
                break
            steps.append(tuple(np.stack(r) for r in zip(*rows)))
            start += reuse
        if not steps:
            raise UserError(f"the corpus gives each of the {forward} lanes {per_lane} tokens, too few for one "
                            f"{length}-token step; give it more text, a smaller batch_size or data.max_seq_length")
        ids, segments, masked = (np.stack(x, axis=1) for x in zip(*steps))
        reset = np.zeros(ids.shape[:2], np.int32)
        reset[:, 0] = 1
        return {"input_ids": ids.astype(np.int32), "segment_ids": segments.astype(np.int32),
                "input_mask": np.ones_like(ids, np.int32), "is_masked": masked.astype(np.int8),
                "carry_reset": reset}

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        ids = batch["input_ids"]
        lead, length = ids.shape[:-1], ids.shape[-1]
        flat = ids.reshape(-1, length)
        masked = batch["is_masked"].reshape(-1, length).astype(bool)
        functional = np.isin(flat, self.functional)
        perm, mapping, targets, weights = [], [], [], []
        for row, m, f in zip(flat, masked, functional):
            mask, is_target = permutation.row_perm_mask(m, f, self.settings.reuse_len, self.settings.perm_size, rng)
            onehot, positions, w = permutation.target_mapping(is_target, self.settings.num_predict)
            perm.append(mask)
            mapping.append(onehot)
            targets.append(np.where(w > 0, row[positions], 0))
            weights.append(w)
        out = {k: v for k, v in batch.items() if k != "is_masked"}
        p = self.settings.num_predict
        out.update(perm_mask=np.stack(perm).reshape(*lead, length, length),
                   target_mapping=np.stack(mapping).reshape(*lead, p, length),
                   targets=np.stack(targets).astype(np.int32).reshape(*lead, p),
                   target_weights=np.stack(weights).reshape(*lead, p))
        return out


@register("contiguous_lm")
class ContiguousLM(Transform):
    """Transformer-XL's lanes (kimiyoung/transformer-xl `LMOrderedIterator`): the documents in
    order, each its sentences followed by the tokenizer's eos, as one token stream in which every
    token predicts the next, across sentence, document and segment boundaries (the memory carries
    the context over a segment boundary; only the stream's last token has no target). `lanes.cut`
    cuts it into data.max_seq_length-token segments of `lanes` lanes.

    Keys [lanes, steps, length]: input_ids, targets, target_weights (1.0 but at the stream's end).
    No input_mask: every position is a real token."""

    contiguous = True

    def instances(self, documents: Sequence[Document], rng: np.random.Generator, lanes_: int) -> Batch:
        eos = np.array([self.tokenizer.eos_id])
        pieces = [np.concatenate([*[s for s in doc if len(s)], eos]) for doc in documents if any(len(s) for s in doc)]
        if not pieces:
            raise UserError("the corpus holds no text; give it some")
        ids = np.concatenate(pieces).astype(np.int32)[None]
        stream = {"input_ids": ids, **next_token_targets(ids, np.ones_like(ids))}
        return lanes.cut({k: v[0] for k, v in stream.items()}, lanes_, self.cfg.max_seq_length, rng)
