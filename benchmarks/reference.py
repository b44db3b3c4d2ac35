"""The Hugging Face references, trained with the same loss and AdamW step as ours.

- BERT: `FlaxBertForPreTraining`, random init from a BertConfig (nothing downloaded). Its MLM
  head runs at every position, as the library does; the loss then reads the logits at the masked
  positions, so both models optimise the same objective on the same batch and only the
  implementations differ.
- GPT-2: `FlaxGPT2LMHeadModel`, random init from the GPT2Config that exporting our run would
  write (interop's translation of the `model` block), with the causal-LM loss as HF's Flax users
  write it: logits at every position, shifted by one against the input ids, mean cross-entropy.
- T5 and BART: `FlaxT5ForConditionalGeneration` / `FlaxBartForConditionalGeneration`, random init
  from the config an export of our run would write, fed the same source, decoder input and
  masks, with our seq2seq loss (cross-entropy over the target tokens, weighted by
  `target_weights`) on their logits. transformers 4.57's Flax T5 calls `jnp.clip(x, a_max=...)`,
  a spelling jax 0.10 removed; `hf_seq2seq_model` hands that one module a `jnp` whose `clip`
  takes it (the same function, `jnp.clip(x, max=...)`), and nothing else changes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertology import models
from bertology.errors import UserError
from bertology.interop import hf_config, records
from bertology.models.transformer import TransformerConfig
from bertology.objectives import divided
from bertology.objectives.bert import mlm_loss, mlm_means, nsp_loss


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


def _exported_config(record: records.HFModel, block: dict[str, Any], recipe: str) -> tuple[dict, TransformerConfig]:
    """(the HF config.json an export of a run with `block` writes, our TransformerConfig), or a
    UserError when that HF model type does not compute what our block does."""
    mismatch = record.mismatch(models.encoder_config(block))
    if mismatch:
        raise UserError(f"the {record.model_type} reference needs {mismatch}; benchmark a config of {recipe}")
    ((source, cfg),) = record.configs(block).items()
    return hf_config.to_hf(record, block, source, cfg, tokenizer=None), cfg


def hf_gpt2_model(block: dict[str, Any], seed: int = 0) -> Any:
    """FlaxGPT2LMHeadModel for our GPT `model` block: the config an export of the run would write,
    so shapes, tanh GELU, dropout rates, LayerNorm eps and init range are the same as ours."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    config, cfg = _exported_config(records.registry()["gpt2"], block, "configs/gpt.py:gpt2")
    return FlaxGPT2LMHeadModel(GPT2Config.from_dict(config), seed=seed, dtype=cfg.compute_dtype)


class _ClipWithOldKeywords:
    """`jax.numpy` for a module written against jax < 0.7, whose `clip` took `a_min`/`a_max`."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    @staticmethod
    def clip(x: jax.Array, a_min: Any = None, a_max: Any = None) -> jax.Array:
        return jnp.clip(x, min=a_min, max=a_max)


def hf_seq2seq_model(block: dict[str, Any], seed: int = 0) -> tuple[Any, Any]:
    """(FlaxT5ForConditionalGeneration or FlaxBartForConditionalGeneration, its random parameters)
    for our `t5` or `bart` model block, from the config an export of the run would write (same shapes, activation,
    dropout rates, norm eps, tying)."""
    import transformers
    from transformers.models.t5 import modeling_flax_t5

    modeling_flax_t5.jnp = _ClipWithOldKeywords()
    record = records.for_run(block)
    if record not in (records.registry()["t5"], records.registry()["bart"]):
        raise UserError(f"family {block['family']!r} has no Flax seq2seq reference; benchmark configs/t5.py or "
                        "configs/bart.py")
    config, cfg = _exported_config(record, block, "configs/t5.py or configs/bart.py")
    flax_class, config_class = {
        "t5": (transformers.FlaxT5ForConditionalGeneration, transformers.T5Config),
        "bart": (transformers.FlaxBartForConditionalGeneration, transformers.BartConfig),
    }[record.model_type]
    model = flax_class(config_class.from_dict(config), dtype=cfg.compute_dtype, _do_init=False)
    return model, jax.jit(model.init_weights, static_argnums=1)(jax.random.PRNGKey(seed), (1, 1))  # eager init is slow


def hf_seq2seq_loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: Any) -> tuple[jax.Array, dict]:
    """Our seq2seq loss (target cross-entropy weighted by `target_weights`) on the reference's
    teacher-forced logits; the signature of bertology's objectives."""
    logits = model(batch["input_ids"], attention_mask=batch["input_mask"],
                   decoder_input_ids=batch["decoder_input_ids"], decoder_attention_mask=batch["decoder_input_mask"],
                   params=params, dropout_rng=rng, train=rng is not None).logits
    metrics = divided(mlm_means(logits, batch["targets"], batch["target_weights"], name="lm"))
    return metrics["lm_loss"], metrics


def shifted_cross_entropy(logits: jax.Array, input_ids: jax.Array) -> jax.Array:
    """HF's causal-LM loss: position i predicts input i + 1, mean over the length - 1 pairs."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), input_ids[:, 1:]).mean()


def hf_causal_lm_loss(params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, model: Any) -> tuple[jax.Array, dict]:
    """The GPT-2 reference's loss, the signature of bertology's objectives."""
    logits = model(batch["input_ids"], attention_mask=batch["input_mask"], params=params, dropout_rng=rng,
                   train=rng is not None).logits
    loss = shifted_cross_entropy(logits, batch["input_ids"])
    return loss, {"loss": loss}
