"""TinyBERT's distillation losses (Jiao et al. 2020; TB `general_distill.py`, `task_distill.py`).

`stage="general"` (pretraining text, a `tinybert` student, any BERT-style teacher with an
`encoder`), three terms, each a mean of squared errors, added with coefficient 1 (the reference
sums att + rep, unweighted):
- `att_loss`: over the mapped layers (`families.tinybert.model.layer_map`), the MSE between student and
  teacher pre-softmax attention scores, with entries at padding keys zeroed in both (the
  reference adds the -10000 mask and then zeroes entries <= -100, so they contribute nothing);
  student and teacher must have the same number of heads;
- `hidden_loss`: the MSE between each student layer's output through `fit_dense` (W_h) and the
  mapped teacher layer's output;
- `emb_loss`: the same for the embedding outputs (the reference folds it into the hidden loss as
  its index 0; reported apart here, same weight).
Each term is a sum over its layers of per-element means, averaged over real (non-pad) query
tokens: the reference averages over padded rows too, whose values depend on nothing the batch
asks to predict.

`stage="prediction"` (task-specific distillation while fine-tuning, the teacher a fine-tuned
classification run): `soft_ce`, the cross-entropy of the student's tempered distribution
against the teacher's, -Σ_c softmax(t/T)_c · log_softmax(s/T)_c, averaged over rows (the
reference's `.mean()` also divides by the number of classes: the same gradient direction, a
constant factor). T = 1 by default, as the reference's.

`model` is a `bertology.train.teacher.WithTeacher`; the teacher runs deterministically behind
`stop_gradient`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.families.tinybert.model import layer_map
from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply
from bertology.train.teacher import WithTeacher

Array = jax.Array
STAGES = ("general", "prediction")


def layers_and_scores(model: nn.Module, params: Any, batch: dict[str, Array], rng: Array | None,
                      projected: bool) -> tuple[list[Array], list[Array]]:
    """(every layer's states, embeddings first; every layer's pre-softmax scores [B, heads, L, L])
    of a model with an `encoder`; `projected`: the states through the model's `fit_dense`."""

    def run(m: nn.Module, b: dict[str, Array]) -> list[Array]:
        return m(b, deterministic=rng is None)["layers"] if projected else m.encoder(b, deterministic=True)["layers"]

    layers, state = model.apply({"params": params}, batch, method=run, mutable=["intermediates"],
                                rngs=None if rng is None else {"dropout": rng})
    sown = state["intermediates"]["encoder"]
    blocks = sorted((k for k in sown if k.startswith("attention_")), key=lambda k: int(k.split("_")[1]))
    depth = len(layers) - 1
    if not blocks or "layers" in sown:
        raise UserError("TinyBERT distillation reads every layer's attention scores; set model.scan_layers=False")
    # shared layers (ALBERT) sow once per application into the one block
    scores = [sown[blocks[i % len(blocks)]]["scores"][i // len(blocks)] for i in range(depth)]
    return layers, scores


def _general(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher) -> Terms:
    s_layers, s_scores = layers_and_scores(model.student, params, batch, rng, projected=True)
    t_layers, t_scores = jax.lax.stop_gradient(
        layers_and_scores(model.teacher, model.teacher_params, batch, None, projected=False))
    if s_layers[0].shape[-1] != t_layers[0].shape[-1]:
        raise UserError(f"the student projects to width {s_layers[0].shape[-1]} but the teacher's is "
                        f"{t_layers[0].shape[-1]}; set model.teacher_hidden_size={t_layers[0].shape[-1]}")
    if s_scores[0].shape[1] != t_scores[0].shape[1]:
        raise UserError(f"the student has {s_scores[0].shape[1]} attention heads and the teacher "
                        f"{t_scores[0].shape[1]}; attention distillation needs them equal (set model.num_heads)")
    mapping = layer_map(len(t_scores), len(s_scores))
    keys = (batch["input_mask"] > 0)[:, None, None, :]
    att = sum(jnp.mean(jnp.square(jnp.where(keys, s - t_scores[mapping[m + 1] - 1], 0.0)), axis=(1, 3))
              for m, s in enumerate(s_scores))

    def mse(s: Array, t: Array) -> Array:
        return jnp.mean(jnp.square(s.astype(jnp.float32) - t.astype(jnp.float32)), axis=-1)

    hidden = sum(mse(s_layers[m], t_layers[mapping[m]]) for m in range(1, len(s_layers)))
    tokens = batch["input_mask"]
    means = {"att_loss": Mean.of(att, tokens), "hidden_loss": Mean.of(hidden, tokens),
             "emb_loss": Mean.of(mse(s_layers[0], t_layers[0]), tokens)}
    return Terms(loss={"att_loss": 1.0, "hidden_loss": 1.0, "emb_loss": 1.0}, means=means)


def _prediction(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher,
                temperature: float) -> Terms:
    s_logits = apply(model.student, params, batch, rng)["logits"]
    t_logits = jax.lax.stop_gradient(apply(model.teacher, model.teacher_params, batch, None)["logits"])
    if s_logits.shape != t_logits.shape or s_logits.ndim != 2:
        raise UserError("prediction-layer distillation needs a classification task and a teacher fine-tuned on it "
                        f"(logits {t_logits.shape} vs the student's {s_logits.shape}); use such a teacher_checkpoint")
    soft = -jnp.sum(jax.nn.softmax(t_logits / temperature) * jax.nn.log_softmax(s_logits / temperature), axis=-1)
    correct = jnp.argmax(s_logits, -1) == batch["label"]
    return Terms(loss={"soft_ce": 1.0}, means={"soft_ce": Mean.of(soft), "accuracy": Mean.of(correct)})


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher, *, stage: str = "general",
         temperature: float = 1.0) -> Terms:
    """The `stage`'s terms (see the module docstring) as undivided means."""
    if not isinstance(model, WithTeacher):
        raise UserError("objective 'tinybert' needs a teacher; set --config.teacher_checkpoint=DIR")
    if stage not in STAGES:
        raise UserError(f"objective tinybert: stage={stage!r} is unknown; use one of {STAGES}")
    if temperature <= 0:
        raise UserError(f"distillation temperature {temperature} is not > 0; set distill_temperature (TinyBERT: 1)")
    if stage == "general":
        return _general(params, batch, rng, model)
    return _prediction(params, batch, rng, model, temperature)
