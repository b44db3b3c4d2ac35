"""DistilBERT's distillation loss (HF `examples/research_projects/distillation/distiller.py`):

    alpha_kd * T^2 * KL(softmax(t/T) || softmax(s/T))  +  alpha_mlm * MLM  +  alpha_cos * (1 - cos(h_s, h_t))

with T = 2 and alphas 5 / 2 / 1 (the author's values, HF #2013). The KL and the cosine run over
every non-pad token (`input_mask`), not only the masked ones (the reference's default, without
`--restrict_ce_to_mask`); both are means over those tokens (KLDivLoss "batchmean" over the
selected rows, CosineEmbeddingLoss with target 1), and MLM is the cross-entropy at the masked
slots. `h` is the last layer's hidden states.

`model` is a `bertology.train.teacher.WithTeacher`: the run must have `teacher_checkpoint`. The
teacher runs deterministically (eval mode, as the reference's) on the same masked input as the
student, its outputs behind `stop_gradient`; student and teacher must share vocabulary and width.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.models.transformer import gather_positions
from bertology.objectives import Mean, Terms
from bertology.objectives.bert import mlm_means
from bertology.train.teacher import WithTeacher

Array = jax.Array


def token_outputs(model: nn.Module, params: Any, batch: dict[str, Array], rng: Array | None) -> tuple[Array, Array]:
    """(MLM logits [B, L, V] float32, last hidden states [B, L, H]) of a BERT-style model (one
    with `encoder` and a tied `mlm` head) at every position; `rng` None: no dropout."""

    def run(m: nn.Module, b: dict[str, Array]) -> tuple[Array, Array]:
        hidden = m.encoder(b, deterministic=rng is None)["sequence"]
        return m.mlm(hidden, m.encoder.attend), hidden

    return model.apply({"params": params}, batch, method=run, rngs=None if rng is None else {"dropout": rng})


def loss(params: Any, batch: dict[str, Array], rng: Array | None, model: WithTeacher, *, temperature: float = 2.0,
         alpha_kd: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0) -> Terms:
    """The three terms as undivided means: `kd_loss` (already times T^2), `mlm_loss`, `cos_loss`."""
    if not isinstance(model, WithTeacher):
        raise UserError("objective 'distil' needs a teacher; set --config.teacher_checkpoint=DIR (a pretraining run "
                        "or a converted Hugging Face checkpoint)")
    s_logits, s_hidden = token_outputs(model.student, params, batch, rng)
    t_logits, t_hidden = jax.lax.stop_gradient(token_outputs(model.teacher, model.teacher_params, batch, None))
    if s_hidden.shape[-1] != t_hidden.shape[-1]:
        raise UserError(f"the student's hidden size {s_hidden.shape[-1]} differs from the teacher's "
                        f"{t_hidden.shape[-1]}; the cosine term needs them equal (set model.hidden_size)")
    log_p_s = jax.nn.log_softmax(s_logits / temperature, axis=-1)
    log_p_t = jax.nn.log_softmax(t_logits / temperature, axis=-1)
    kd = temperature ** 2 * jnp.sum(jnp.exp(log_p_t) * (log_p_t - log_p_s), axis=-1)
    s32, t32 = s_hidden.astype(jnp.float32), t_hidden.astype(jnp.float32)
    cos = jnp.sum(s32 * t32, -1) / jnp.maximum(jnp.linalg.norm(s32, axis=-1) * jnp.linalg.norm(t32, axis=-1), 1e-8)
    tokens = batch["input_mask"]
    means = {"kd_loss": Mean.of(kd, tokens), "cos_loss": Mean.of(1.0 - cos, tokens),
             **mlm_means(gather_positions(s_logits, batch["masked_positions"]), batch["masked_ids"],
                         batch["masked_weights"])}
    return Terms(loss={"kd_loss": alpha_kd, "mlm_loss": alpha_mlm, "cos_loss": alpha_cos}, means=means)
