"""TinyBERT (Jiao et al. 2020): a narrow, shallow BERT distilled layer by layer from a BERT teacher.

The student is the shared BERT encoder (segments and pooler kept, so fine-tuning and export take
it as any BERT) plus `fit_dense`, the one learned projection W_h from the student's width to the
teacher's that the hidden-state and embedding losses go through (the reference applies a single
`fit_dense` to every layer, TB `transformer/modeling.py` TinyBertForPreTraining). `fit_dense`
exists only for distillation: `trunk` leaves it out.

General distillation (`families/tinybert/objective.py`) has no MLM loss (TB#24), so the model has no
MLM head: its output is every layer's states projected to the teacher's width; the attention
scores it compares come from the encoder's sown `intermediates` (see `transformer.Attention`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import ml_collections

from bertology.errors import UserError
from bertology.models import Family, encoder_config, flops
from bertology.models.transformer import Encoder, TransformerConfig, dense

Array = jax.Array
EXTRA_KEYS = ("teacher_hidden_size",)


def layer_map(teacher_depth: int, student_depth: int) -> list[int]:
    """The uniform mapping: student layer m (1-based) learns from teacher layer m·N/M, so a
    4-layer student of a 12-layer teacher reads layers 3, 6, 9, 12 (TB `general_distill.py`:
    k = N/M, attention i <- teacher i·k + k - 1 counting from 0). Index 0 (the embeddings) maps to 0."""
    if student_depth < 1 or teacher_depth % student_depth:
        raise UserError(f"TinyBERT's uniform layer mapping needs the teacher's {teacher_depth} layers to be a multiple "
                        f"of the student's {student_depth}; set model.num_layers to a divisor of {teacher_depth}")
    k = teacher_depth // student_depth
    return [m * k for m in range(student_depth + 1)]


class Model(nn.Module):
    """Outputs `layers`: the embedding output and every layer's, each through `fit_dense`
    ([batch, length, teacher width])."""

    cfg: TransformerConfig
    teacher_hidden_size: int

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.fit_dense = dense(self.cfg, self.teacher_hidden_size, ("embed", "hidden"), "fit_dense")

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        out = self.encoder(batch, deterministic=deterministic)
        return {"layers": [self.fit_dense(x) for x in out["layers"]]}


def build(model_config: ml_collections.ConfigDict | dict) -> Model:
    cfg = encoder_config(model_config)
    return Model(cfg, dict(model_config).get("teacher_hidden_size") or cfg.hidden_size)


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The student's stack over every token (trained: forward and backward) and the projection of
    every layer; the teacher's forward pass is not counted (it is not trained)."""
    cfg = encoder_config(config.model)
    width = config.model.get("teacher_hidden_size") or cfg.hidden_size
    return flops.TRAIN * (flops.stack(cfg, config.data.max_seq_length, nominal=nominal)
                          + (cfg.num_layers + 1) * 2 * cfg.hidden_size * width)


FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, build=build)
