"""The fine-tuning objective of Ramachandran, Liu & Le 2017 (§2.2, "language modeling loss as a
regularizer"): the seq2seq cross-entropy plus the source LM's loss (the encoder run as a causal LM
over the source) and the target LM's (the decoder over the target without the source), so that
fine-tuning on little labelled data does not wash out what the language models learned.

    loss = lm_loss + source_lm_weight · source_lm_loss + target_lm_weight · target_lm_loss

`lm_loss` is the seq2seq term (`objectives.seq2seq`, label smoothing included; perplexity is
derived from it). A weight of 0 skips that language model's pass, so 0 and 0 is the plain seq2seq
loss. Each LM term is a mean over its own tokens: the source's next-token predictions (every real
source token after the first) and the target's (the seq2seq targets themselves).

Both versions of the paper train with it: GPT2GPT (Transformer stacks) and LSTM2LSTM (the paper's
LSTMs, `families/lstm2lstm`), each model giving the two LMs' logits as its `source_lm` and
`target_lm` methods; `seq2seq_training` is either family's fine-tuning hook.
"""

from __future__ import annotations

from typing import Any, Callable, cast

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from bertology import objectives
from bertology.data.rows import ShuffledRows
from bertology.errors import UserError
from bertology.generation import decoder_start_id
from bertology.objectives import Terms
from bertology.objectives import seq2seq as seq2seq_objective
from bertology.objectives.bert import apply, mlm_means

DERIVED = seq2seq_objective.DERIVED


def loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: nn.Module, *,
         source_lm_weight: float = 1.0, target_lm_weight: float = 1.0, label_smoothing: float = 0.0) -> Terms:
    if min(source_lm_weight, target_lm_weight) < 0:
        raise UserError(f"source_lm_weight={source_lm_weight}, target_lm_weight={target_lm_weight}: "
                        "the language-model weights must be >= 0 (0 turns one off)")
    terms = seq2seq_objective.loss(params, batch, rng, model, label_smoothing=label_smoothing)
    coefficients, means = dict(terms.loss), dict(terms.means)
    # each pass its own dropout draws
    key = (lambda i: None) if rng is None else (lambda i: jax.random.fold_in(rng, i))
    if source_lm_weight:
        logits = apply(model, params, batch, key(1), method="source_lm")
        means.update(mlm_means(logits[:, :-1], batch["input_ids"][:, 1:], batch["input_mask"][:, 1:], name="source_lm"))
        coefficients["source_lm_loss"] = source_lm_weight
    if target_lm_weight:
        logits = apply(model, params, batch, key(2), method="target_lm")
        means.update(mlm_means(logits, batch["targets"], batch["target_weights"], name="target_lm"))
        coefficients["target_lm_loss"] = target_lm_weight
    return Terms(loss=coefficients, means=means)


def seq2seq_training(model: type[nn.Module]) -> Callable[..., tuple[ShuffledRows, objectives.Objective, dict]]:
    """The `Family.seq2seq_training` of a family trained with this objective (GPT2GPT, LSTM2LSTM):
    teacher-forced rows as any encoder-decoder's, the decoder starting where `model`'s class
    says (`decoder_start`), the loss this module's with `source_lm_weight` and `target_lm_weight`
    from the fine-tuning config (the defaults above where it has none)."""

    def training(config: ml_collections.ConfigDict, tokenizer: Any, examples: list[dict], source_length: int,
                 target_length: int) -> tuple[ShuffledRows, objectives.Objective, dict[str, np.ndarray]]:
        from bertology.train.finetune import seq2seq_arrays

        weights = {k: config[k] for k in ("source_lm_weight", "target_lm_weight") if k in config}
        arrays = seq2seq_arrays(examples, tokenizer, source_length, target_length,
                                decoder_start_id(config.data, cast(nn.Module, model), tokenizer))  # reads decoder_start
        objective = objectives.get({"name": "gpt2gpt", "label_smoothing": config.get("label_smoothing", 0.0), **weights})
        return ShuffledRows(arrays, config.batch_size, config.seed), objective, {k: v[:1] for k, v in arrays.items()}

    return training
