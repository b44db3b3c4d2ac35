"""The Hugging Face references, trained with the same loss and AdamW step as ours.

- BERT: `FlaxBertForPreTraining`, random init from a BertConfig (nothing downloaded). Its MLM
  head runs at every position, as the library does; the loss then reads the logits at the masked
  positions, so both models optimise the same objective on the same batch and only the
  implementations differ.
- GPT-2: `FlaxGPT2LMHeadModel`, random init from the GPT2Config that exporting our run would
  write (interop's translation of the `model` block), with the causal-LM loss as HF's Flax users
  write it: logits at every position, shifted by one against the input ids, mean cross-entropy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertology import models
from bertology.errors import UserError
from bertology.interop import families, hf_config
from bertology.models.transformer import TransformerConfig
from bertology.objectives.bert import mlm_loss, nsp_loss


def hf_model(cfg: TransformerConfig, seed: int = 0) -> Any:
    """FlaxBertForPreTraining with the shapes of `cfg` (exact GELU and dropout rates as ours)."""
    from transformers import BertConfig, FlaxBertForPreTraining

    config = BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout_rate,
        attention_probs_dropout_prob=cfg.attention_dropout_rate,
        max_position_embeddings=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps,
        initializer_range=cfg.initializer_range,
    )
    return FlaxBertForPreTraining(config, seed=seed, dtype=cfg.compute_dtype)


def hf_loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: Any) -> tuple[jax.Array, dict]:
    """MLM (at the masked positions) + NSP, the signature of bertology's objectives."""
    out = model(
        batch["input_ids"],
        attention_mask=batch["input_mask"],
        token_type_ids=batch["segment_ids"],
        params=params,
        dropout_rng=rng,
        train=rng is not None,
    )
    logits = jnp.take_along_axis(out.prediction_logits, batch["masked_positions"][..., None], axis=1)
    mlm, metrics = mlm_loss(logits, batch["masked_ids"], batch["masked_weights"])
    nsp, nsp_metrics = nsp_loss(out.seq_relationship_logits, batch["next_sentence_label"])
    return mlm + nsp, {"loss": mlm + nsp, **metrics, **nsp_metrics}


def hf_gpt2_model(block: dict[str, Any], seed: int = 0) -> Any:
    """FlaxGPT2LMHeadModel for our GPT `model` block: the config an export of the run would write,
    so shapes, tanh GELU, dropout rates, LayerNorm eps and init range are the same as ours."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    record = families.GPT2
    mismatch = record.mismatch(models.encoder_config(block))
    if mismatch:
        raise UserError(f"the GPT-2 reference needs {mismatch}; benchmark a GPT-2 config (configs/gpt.py:gpt2)")
    ((source, cfg),) = record.configs(block).items()
    config = GPT2Config.from_dict(hf_config.to_hf(record, block, source, cfg, tokenizer=None))
    return FlaxGPT2LMHeadModel(config, seed=seed, dtype=cfg.compute_dtype)


def shifted_cross_entropy(logits: jax.Array, input_ids: jax.Array) -> jax.Array:
    """HF's causal-LM loss: position i predicts input i + 1, mean over the length - 1 pairs."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), input_ids[:, 1:]).mean()


def hf_causal_lm_loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: Any) -> tuple[jax.Array, dict]:
    """The GPT-2 reference's loss, the signature of bertology's objectives."""
    logits = model(batch["input_ids"], attention_mask=batch["input_mask"], params=params, dropout_rng=rng,
                   train=rng is not None).logits
    loss = shifted_cross_entropy(logits, batch["input_ids"])
    return loss, {"loss": loss}
