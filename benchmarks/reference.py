"""The Hugging Face reference: `FlaxBertForPreTraining` trained with the same loss and AdamW step.

Random init from a BertConfig (nothing downloaded). Its MLM head runs at every position, as the
library does; the loss then reads the logits at the masked positions, so both models optimise
the same objective on the same batch and only the implementations differ.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

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
