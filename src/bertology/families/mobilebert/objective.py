"""MobileBERT's progressive knowledge transfer, then pretraining distillation (Sun et al. 2020).

The paper's teacher, IB-BERT (a BERT-large with the student's inter-block width and embedding),
was never released, nor code to train it (google-research#267, #496, #903). Here the teacher is
a plain BERT (`bert` family) of the student's hidden size, depth and head count, loaded with
`--config.teacher_checkpoint`; the student's embeddings therefore cannot be copied from it and
are trained with layer 0.

`stage="transfer"`, `layer=l` (0-based): layer l's output and attention against the teacher's
layer l, the student's lower layers behind `stop_gradient` (`mobilebert.Encoder.transfer`) and
its upper layers and heads not run, so only layer l (and at l = 0 the embeddings) gets a
gradient. Terms, each a mean over real (non-pad) tokens, with the reference's coefficients
(`run_pretraining.py` / `distill_util.py`):
- `fmt_loss` (x100): feature-map transfer, the MSE between the two outputs each normalised by a
  parameter-free LayerNorm over the hidden axis (eps `FEATURE_EPS`);
- `mean_loss` (x5000) and `var_loss` (x5): the squared difference of the per-token means over
  the hidden axis and the absolute difference of their variances. The public code compares the
  student's layer with `teacher_hiddens`, the whole list of teacher layers (a bug); here it is
  the matched teacher layer;
- `att_loss` (x1): attention transfer, KL(teacher || student) of each head's attention
  distribution over the real keys, averaged over heads (the paper's KL; the code's
  cross-entropy differs from it by the teacher's entropy, a constant).

`stage="distill"`: pretraining distillation of the whole model: MLM against 0.5 x the teacher's
soft labels (T = 1) + 0.5 x the one-hot label, i.e. `alpha` x `mlm_loss` + (1 - `alpha`) x
`kd_loss` (-sum p_teacher log p_student) at the masked slots, plus NSP.

The schedule (one run per stage: L transfer stages, each starting from the previous one's
checkpoint, then the distillation run) is in `configs/mobilebert.py`. Each transfer run starts a
fresh optimizer without weight decay, so a layer without gradient gets exactly zero updates
(Adam's moments stay 0) and stays bit-identical.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.families.tinybert.objective import layers_and_scores
from bertology.objectives import Mean, Terms
from bertology.objectives.bert import apply, mlm_means, nsp_means
from bertology.train.teacher import WithTeacher

Array = jax.Array
STAGES = ("transfer", "distill")
FEATURE_EPS = 1e-12
TRANSFER = {"fmt_loss": 100.0, "mean_loss": 5000.0, "var_loss": 5.0, "att_loss": 1.0}


def feature_terms(student: Array, teacher: Array) -> dict[str, Array]:
    """Per-token [B, L] feature-map terms of two [B, L, H] outputs (see the module docstring)."""
    s, t = student.astype(jnp.float32), teacher.astype(jnp.float32)
    s_mean, t_mean = jnp.mean(s, -1, keepdims=True), jnp.mean(t, -1, keepdims=True)
    s_var, t_var = jnp.var(s, -1, keepdims=True), jnp.var(t, -1, keepdims=True)
    normed = lambda x, m, v: (x - m) / jnp.sqrt(v + FEATURE_EPS)  # noqa: E731
    return {"fmt_loss": jnp.mean(jnp.square(normed(s, s_mean, s_var) - normed(t, t_mean, t_var)), -1),
            "mean_loss": jnp.square(s_mean - t_mean)[..., 0],
            "var_loss": jnp.abs(s_var - t_var)[..., 0]}


def attention_kl(student: Array, teacher: Array, input_mask: Array) -> Array:
    """Per-token [B, L] KL(teacher || student) of [B, heads, L, L] pre-softmax scores over the
    real keys, averaged over heads."""
    keys = (input_mask > 0)[:, None, None, :]
    log_s, log_t = (jax.nn.log_softmax(jnp.where(keys, x, jnp.finfo(jnp.float32).min), axis=-1)
                    for x in (student.astype(jnp.float32), teacher.astype(jnp.float32)))
    kl = jnp.sum(jnp.where(keys, jnp.exp(log_t) * (log_t - log_s), 0.0), axis=-1)
    return jnp.mean(kl, axis=1)


def _transfer(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher, layer: int) -> Terms:
    depth = model.student.cfg.num_layers
    if not 0 <= layer < depth:
        raise UserError(f"objective mobilebert: layer={layer} is not a layer of the {depth}-layer student; "
                        f"use 0..{depth - 1}")
    out, state = model.student.apply(
        {"params": params}, batch, layer, deterministic=rng is None, mutable=["intermediates"],
        rngs=None if rng is None else {"dropout": rng}, method=lambda m, b, i, deterministic: m.encoder.transfer(
            b, i, deterministic=deterministic))
    scores = state["intermediates"]["encoder"][f"layer_{layer}"]["attention"]["scores"][0]
    t_layers, t_scores = jax.lax.stop_gradient(layers_and_scores(model.teacher, model.teacher_params, batch, None,
                                                                 projected=False))
    if len(t_scores) != depth:
        raise UserError(f"the teacher has {len(t_scores)} layers and the student {depth}; progressive transfer "
                        "needs a teacher of the student's depth (set model.num_layers)")
    if t_layers[layer + 1].shape[-1] != out.shape[-1] or t_scores[layer].shape[1] != scores.shape[1]:
        raise UserError(f"the teacher's width {t_layers[layer + 1].shape[-1]} and {t_scores[layer].shape[1]} heads "
                        f"differ from the student's {out.shape[-1]} and {scores.shape[1]}; progressive transfer "
                        "needs them equal (set model.hidden_size and model.num_heads)")
    per_token = {**feature_terms(out, t_layers[layer + 1]),
                 "att_loss": attention_kl(scores, t_scores[layer], batch["input_mask"])}
    return Terms(loss=TRANSFER, means={k: Mean.of(v, batch["input_mask"]) for k, v in per_token.items()})


def _distill(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher, alpha: float) -> Terms:
    out = apply(model.student, params, batch, rng)
    teacher = jax.lax.stop_gradient(apply(model.teacher, model.teacher_params, batch, None)["mlm_logits"])
    if teacher.shape != out["mlm_logits"].shape:
        raise UserError(f"the teacher's MLM logits {teacher.shape} differ from the student's "
                        f"{out['mlm_logits'].shape}; distillation needs a BERT teacher with the student's vocabulary")
    soft = -jnp.sum(jax.nn.softmax(teacher.astype(jnp.float32)) * jax.nn.log_softmax(out["mlm_logits"]), axis=-1)
    means = {**mlm_means(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
             "kd_loss": Mean.of(soft, batch["masked_weights"], eps=1e-5),
             **nsp_means(out["nsp_logits"], batch["next_sentence_label"])}
    return Terms(loss={"mlm_loss": alpha, "kd_loss": 1.0 - alpha, "nsp_loss": 1.0}, means=means)


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher, *, stage: str = "distill",
         layer: int = 0, alpha: float = 0.5) -> Terms:
    """The `stage`'s terms (see the module docstring) as undivided means."""
    if not isinstance(model, WithTeacher):
        raise UserError("objective 'mobilebert' needs a BERT teacher; set --config.teacher_checkpoint=DIR")
    if stage not in STAGES:
        raise UserError(f"objective mobilebert: stage={stage!r} is unknown; use one of {STAGES}")
    if not 0.0 <= alpha <= 1.0:
        raise UserError(f"objective mobilebert: alpha={alpha} is not in [0, 1] (the one-hot label's share; paper 0.5)")
    if stage == "transfer":
        return _transfer(params, batch, rng, model, layer)
    return _distill(params, batch, rng, model, alpha)
