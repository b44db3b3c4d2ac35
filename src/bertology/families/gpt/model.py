"""GPT (Radford et al. 2018) and GPT-2 (Radford et al. 2019): a causal Transformer decoder whose
output layer is tied to its token table.

GPT-1 is post-LN with learned positions; GPT-2 moves the norm before each sublayer, adds a final
norm, and scales the initialisation of the projections into the residual stream by
1/sqrt(2·layers). Both are settings of the shared core (`norm`, `scale_residual_init`), so this
module only adds the tied output, the KV-cached decoding entry point and the fine-tuning trunk.

Fine-tuning (Radford et al. 2018, §3.2) runs the decoder causally and gives the task head the
state of each row's last real token, the only one that has read the whole input (GPT-1's
`extract` token; `GPT2ForSequenceClassification` reads the last non-padding token the same way).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.models import Family, encoder_config, flops
from bertology.models.transformer import Decoder, Stack, TransformerConfig, last_real


class Model(nn.Module):
    """Next-token logits [batch, length, vocab] at every position (`logits`).

    `decode=True` runs incrementally against the KV cache: the batch then holds only the new
    tokens (and their `positions`), and the cache (flax collection `cache`) holds the past.
    `output_layer` gives the final states and the tied table instead of the logits, for a loss
    that never holds all [tokens, vocab] of them at once (`objectives.chunked_token_means`).
    """

    cfg: TransformerConfig

    def setup(self):
        self.decoder = Decoder(self.cfg, name="decoder")

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True,
                 decode: bool = False) -> dict[str, jax.Array]:
        out = self.decoder(batch, deterministic=deterministic, decode=decode)
        return {"logits": self.cfg.real_logits(self.decoder.attend(out["sequence"]).astype(jnp.float32))}

    def output_layer(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, jax.Array]:
        """`states` [batch, length, H] and the output `table` [padded vocab, H] whose products
        are `__call__`'s logits (before the padded columns are sliced away)."""
        states = self.decoder(batch, deterministic=deterministic)["sequence"]
        return {"states": states, "table": self.decoder.embeddings.token.embedding}


class TaskTrunk(Stack):
    """The fine-tuning trunk (`task_trunk`): the decoder's stack run causally, `pooled` at each
    row's last real token (`transformer.last_real`); its parameters are the pretraining run's
    decoder (`trunk`)."""

    causal: bool = True

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> dict[str, Any]:
        layers = self.run(batch, deterministic)
        return {"sequence": layers[-1], "pooled": last_real(layers[-1], batch["input_mask"]), "layers": layers}


def task_trunk(cfg: TransformerConfig, name: str) -> TaskTrunk:
    return TaskTrunk(cfg, name=name)


def trunk(params: dict) -> dict:
    return params["decoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The decoder and the tied output layer at every position (nominal counts the same)."""
    cfg = encoder_config(config.model)
    length = config.data.max_seq_length
    return flops.TRAIN * (flops.stack(cfg, length, nominal=nominal) + flops.lm_head(cfg, transform=False))


FAMILY = Family(Model, trunk, flops_per_token, task_trunk=task_trunk)
