"""Sentence-embedding distillation: a student learns a sentence-transformers teacher's embedding
(configs/minilm_student.py: all-MiniLM-L6-v2 into 3 of its layers).

    alpha_sentence * (1 - cos(e_s, e_t))  +  alpha_hidden * (1 - cos(h_s, h_t))

`e` is a row's sentence embedding as sentence-transformers computes it for this kind of model:
the mean of the last layer's states over the row's real tokens ([CLS] and [SEP] included,
padding out; the model's `1_Pooling/config.json` says `pooling_mode_mean_tokens`). `h` is the
last layer's state at each real token (DistilBERT's cosine term), a denser signal for the same
target. The sentence term is a mean over rows that have tokens, the hidden term over real tokens.

Why cosine and not MSE for the sentence term: the teacher's pipeline ends in `Normalize`
(`modules.json`), so its embeddings are used as unit vectors and compared by cosine; only their
direction carries meaning. MSE of the raw pooled vectors would also spend the student's capacity
on their length, which `Normalize` discards; MSE of the normalised vectors is 2·(1 − cos), this
loss up to a factor. The term is thus exactly the figure the recipe reports (held-out
student/teacher cosine).

`model` is a `bertology.train.teacher.WithTeacher`; the teacher runs deterministically behind
`stop_gradient`, on the same (unmasked) input as the student; both must have the same width.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.models.tasks import masked_mean
from bertology.objectives import Mean, Terms
from bertology.train.teacher import WithTeacher

Array = jax.Array
DERIVED = {"sentence_cosine": lambda m: 1.0 - m["sentence_loss"]}  # the figure the recipe reports


def last_hidden(model: nn.Module, params: Any, batch: dict[str, Array], rng: Array | None) -> Array:
    """The last layer's states [B, L, H] of a model with an `encoder` (no head is run);
    `rng` None: no dropout."""

    def run(m: nn.Module, b: dict[str, Array]) -> Array:
        return m.encoder(b, deterministic=rng is None)["sequence"]

    return model.apply({"params": params}, batch, method=run, rngs=None if rng is None else {"dropout": rng})


def cosine(a: Array, b: Array) -> Array:
    """Cosine of the last axis in float32 (0 where either vector is zero)."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.sum(a * b, -1) / jnp.maximum(jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), 1e-8)


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher, *,
         alpha_sentence: float = 1.0, alpha_hidden: float = 1.0) -> Terms:
    """Terms `sentence_loss` (1 − cosine of the mean-pooled embeddings, per row) and
    `hidden_loss` (1 − cosine of the last states, per real token)."""
    if not isinstance(model, WithTeacher):
        raise UserError("objective 'sentence_distil' needs a teacher; set --config.teacher_checkpoint=DIR (a "
                        "pretraining run or a converted Hugging Face checkpoint)")
    student = last_hidden(model.student, params, batch, rng)
    teacher = jax.lax.stop_gradient(last_hidden(model.teacher, model.teacher_params, batch, None))
    if student.shape[-1] != teacher.shape[-1]:
        raise UserError(f"the student's hidden size {student.shape[-1]} differs from the teacher's "
                        f"{teacher.shape[-1]}; sentence distillation compares them directly (set model.hidden_size)")
    tokens = batch["input_mask"]
    rows = jnp.max(tokens, axis=-1)
    sentence = cosine(masked_mean(student, tokens), masked_mean(teacher, tokens))
    means = {"sentence_loss": Mean.of(1.0 - sentence, rows),
             "hidden_loss": Mean.of(1.0 - cosine(student, teacher), tokens)}
    return Terms(loss={"sentence_loss": alpha_sentence, "hidden_loss": alpha_hidden}, means=means)
