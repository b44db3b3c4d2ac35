"""Quick-Thought (Logeswaran & Lee 2018): a sentence encoder f and a context encoder g, trained so
that f(s)·g(c) picks the sentences next to s out of every sentence in the batch (a classifier over
the candidates, not a decoder of the context as Skip-Thought's).

Both encoders are the core's bidirectional `Encoder`, each reading one sentence; a sentence's
vector is its first token's pooled state. Rows hold several consecutive sentences of one
document ([rows, sentences, length]: `families/quick_thought/data.py`), so each sentence's
neighbours are in the batch with the other rows' sentences as the distractors. Downstream, the
paper reads the two vectors concatenated: so does the fine-tuning trunk (`TaskTrunk`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.transformer import Encoder, TransformerConfig


def _flat(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """[rows, sentences, length] inputs as [rows · sentences, length] (one sentence per row)."""
    return {k: batch[k].reshape(-1, batch[k].shape[-1]) for k in ("input_ids", "input_mask", "segment_ids") if k in batch}


class Model(nn.Module):
    """Outputs `sentence` (f) and `context` (g) vectors [rows · sentences, H], and `real`
    (whether each sentence slot holds a sentence)."""

    cfg: TransformerConfig

    def setup(self):
        self.encoder = Encoder(self.cfg, name="encoder")
        self.context_encoder = Encoder(self.cfg, name="context_encoder")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        inputs = _flat(batch)
        return {"sentence": self.encoder(inputs, deterministic=deterministic)["pooled"],
                "context": self.context_encoder(inputs, deterministic=deterministic)["pooled"],
                "real": inputs["input_mask"][:, 0] > 0}


class TaskTrunk(nn.Module):
    """The fine-tuning trunk: both encoders on the task's rows; `pooled` is [f(s); g(s)] (the
    paper's downstream features), `sequence` and `layers` the sentence encoder's."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, Any]:
        f = Encoder(self.cfg, name="encoder")(batch, deterministic=deterministic)
        g = Encoder(self.cfg, name="context_encoder")(batch, deterministic=deterministic)
        return {"sequence": f["sequence"], "pooled": jnp.concatenate([f["pooled"], g["pooled"]], -1),
                "layers": f["layers"]}


def task_trunk(cfg: TransformerConfig, name: str) -> TaskTrunk:
    return TaskTrunk(cfg, name=name)


def trunk(params: dict) -> dict:
    return {"encoder": params["encoder"], "context_encoder": params["context_encoder"]}


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Two encoders over every sentence (the candidates' scores are a [rows·sentences]² product, negligible)."""
    return 2 * flops.TRAIN * flops.stack(encoder_config(config.model), config.data.max_seq_length, nominal=nominal)


FAMILY = Family(Model, trunk, flops_per_token, task_trunk=task_trunk, task_modes=("full", "features"))
