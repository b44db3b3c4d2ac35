"""T5's pretraining data: `data.objective="span_corruption"`, the denoising objectives of the T5
paper's table (`SpanCorruption`), with the noising rules of `bertology.data.noising`. Registered
with the shared registry (`bertology.data.transforms`), which finds it by importing this module.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
import numpy as np

from bertology.data import noising
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, Transform, noise_options, padded, register, row_tokens, seq2seq_rows
from bertology.errors import UserError

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
        options = noise_options(cfg, dict(kind="spans", density=None, mean_span=3.0, targets=None, random_prob=0.1))
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
        sentences = [np.asarray(s, np.int32) for i in order for s in documents[i]]
        tokens = np.concatenate(sentences) if sentences else np.zeros(0, np.int32)
        chunks = [tokens[at : at + self.raw_length] for at in range(0, len(tokens), self.raw_length)]
        ids, mask = padded([c for c in chunks if len(c) >= 2], self.raw_length, self.tokenizer.pad_id)
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
        for tokens in row_tokens(batch):
            noise = self._noise_mask(len(tokens), rng)
            inputs.append(np.concatenate([self._inputs(tokens, noise, rng), eos]))
            targets.append(np.concatenate([self._targets(tokens, noise), eos]))
        return seq2seq_rows(inputs, targets, self.cfg.max_seq_length, self.target_length, self.tokenizer.pad_id,
                            self.decoder_start)
