"""The simplest pre-BERT baselines (Dai & Le 2015, "Semi-supervised sequence learning"): a forward
word-level LSTM language model and a sequence autoencoder, as pretraining for a classifier.

Both are one network, on ELMo's LSTM code (`families/elmo/model.py`: the LSTMP cell of TF's LSTMCell and
its `jax.lax.scan` over time, `elmo.LSTMStack`), not a second LSTM: a token table [vocab, P], a
stack of LSTM layers projected to P (residual between layers when `use_skip_connections`), and a
softmax tied to the token table plus an output bias. `kind` picks what is pretrained:

- `lm`: next-word prediction on the contiguous word stream (`data.objective=contiguous_lm`,
  objective `transfo_xl`): as ELMo's forward half, the batch is one segment of each lane and holds
  `carry`, the (c, h) of every layer the previous segment ended with; the stack starts from it and
  returns its final states as `carry` (backpropagation truncated at segment boundaries).
- `autoencoder`: the sequence autoencoder (SA-LSTM): the LSTM reads the sentence (`input_ids`,
  right-padded by `input_mask`), then, *from the state it ended with*, reads the decoder inputs
  (the sentence shifted right behind a start token: teacher forcing) and predicts the sentence
  again. As in the paper the encoder and decoder share their weights, so the decoder is the same
  stack continuing the same scan: each row is read as [sentence, decoder inputs] (the decoder's
  tokens right after the sentence's last real token), and the logits at the decoder's positions
  are returned aligned with `targets`. The rows are BART's with its noise off
  (`data.objective=bart`, objective `seq2seq`): the target is the unchanged input.

Either checkpoint initialises a classifier through `task_trunk` (`models/tasks.py`): the same
token table and LSTM stack over a fine-tuning row, from zero states; `pooled` is the top layer's
output at the row's last real token (Dai & Le's classifier reads the LSTM's last state).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertology.errors import UserError
from bertology.families.elmo import model as elmo
from bertology.models import Family, block_fields, encoder_config, flops

Array = jax.Array
KINDS = ("lm", "autoencoder")
# The configs' presets (configs/lstm_lm.py, configs/seq_autoencoder.py): ELMo's tiny and small
# LSTM shapes (one direction of its biLM), its word vocabularies and segment lengths.
PRESETS = {
    "tiny": dict(projection_dim=64, lstm_dim=256, n_layers=2, words=4096, length=32),
    "small": dict(projection_dim=256, lstm_dim=1024, n_layers=2, words=16384, length=20),
}


def model_block(preset: str, kind: str) -> ml_collections.ConfigDict:
    """The `model` block of the two baseline configs (configs/lstm_lm.py, seq_autoencoder.py):
    `preset`'s shapes, residual between layers, no clipping (Dai & Le clip nothing)."""
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    return ml_collections.ConfigDict(dict(
        family="lstm", kind=kind,
        vocab_size=ml_collections.config_dict.placeholder(int),  # None: taken from the word vocabulary
        projection_dim=p["projection_dim"], lstm_dim=p["lstm_dim"], n_layers=p["n_layers"],
        cell_clip=0.0, proj_clip=0.0, use_skip_connections=True, dropout_rate=0.1,
    ))


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
    """The fields `elmo.LSTMStack` reads (its LSTMP layers), plus the vocabulary and `kind`.
    A clip of 0 is no clip; `projection_dim` is also the token embedding's width (tied softmax)."""

    vocab_size: int
    kind: str = "lm"
    projection_dim: int = 512
    lstm_dim: int = 1024
    n_layers: int = 1
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    use_skip_connections: bool = False
    dropout_rate: float = 0.1


def config(model_config: Any) -> LSTMConfig:
    """The LSTMConfig of a `model` block (every key but `family`)."""
    fields = block_fields(model_config, LSTMConfig, "LSTM model")
    if fields.get("kind", "lm") not in KINDS:
        raise UserError(f"model.kind={fields['kind']!r} is not an LSTM baseline; use one of {', '.join(KINDS)}")
    return LSTMConfig(**fields)


def initial_carry(model_config: Any, batch_size: int) -> dict[str, np.ndarray] | None:
    """The LM's zero states for `batch_size` lanes: {c [B, layers, lstm_dim], h [B, layers,
    projection_dim]}; the autoencoder reads whole sentences and carries nothing (None)."""
    cfg = config(model_config)
    if cfg.kind != "lm":
        return None
    return {"c": np.zeros((batch_size, cfg.n_layers, cfg.lstm_dim), np.float32),
            "h": np.zeros((batch_size, cfg.n_layers, cfg.projection_dim), np.float32)}


class Trunk(nn.Module):
    """Token table + LSTM stack: the parameters {embed, lstm} that pretraining trains and a
    classifier starts from. Called on a fine-tuning row (`input_ids`, right-padded `input_mask`):
    {sequence [B, L, P]: the top layer, pooled [B, P]: it at the last real token, layers: the
    embedding then each LSTM layer}."""

    cfg: LSTMConfig

    def setup(self):
        self.embed = nn.Embed(self.cfg.vocab_size, self.cfg.projection_dim,
                              embedding_init=nn.initializers.normal(self.cfg.projection_dim ** -0.5), name="embed")
        self.lstm = elmo.LSTMStack(self.cfg, name="lstm")  # LSTMStack reads only LSTMConfig's fields

    def read(self, ids: Array, deterministic: bool, state: dict[str, Array] | None = None
             ) -> tuple[list[Array], dict[str, Array]]:
        """([embedding, each layer's output], final {c, h}) of one left-to-right scan from `state`
        (None: zeros) with no reset inside the rows."""
        x = self.embed(ids)
        outputs, final = self.lstm(x, jnp.zeros(ids.shape, bool), deterministic, state)
        return [x, *outputs], final

    def __call__(self, inputs: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        layers, _ = self.read(inputs["input_ids"], deterministic)
        last = jnp.maximum(jnp.sum(inputs["input_mask"], axis=1) - 1, 0)
        pooled = jnp.take_along_axis(layers[-1], last[:, None, None], axis=1)[:, 0]
        return {"sequence": layers[-1], "pooled": pooled, "layers": layers}


def task_trunk(cfg: LSTMConfig, name: str) -> Trunk:
    """The classifier's encoder (`models/tasks.py` hook): its params are `trunk(params)`."""
    return Trunk(cfg, name=name)


def decoder_after_sentence(batch: dict[str, Array]) -> tuple[Array, Array]:
    """The autoencoder's rows read as one scan: ids [B, 2L] = the sentence's real tokens, then
    the decoder inputs right after them (padding behind), and the positions [B, L] of the decoder
    inputs in it (where the logits over `targets` are read)."""
    source, decoder = batch["input_ids"], batch["decoder_input_ids"]
    length = source.shape[1]
    n = jnp.sum(batch["input_mask"], axis=1, dtype=jnp.int32)[:, None]
    j = jnp.arange(2 * length)[None]
    from_source = jnp.take_along_axis(source, jnp.broadcast_to(jnp.minimum(j, length - 1), (len(n), 2 * length)), axis=1)
    from_decoder = jnp.take_along_axis(decoder, jnp.clip(j - n, 0, decoder.shape[1] - 1), axis=1)
    return jnp.where(j < n, from_source, from_decoder), n + jnp.arange(decoder.shape[1])[None]


class Model(Trunk):
    """The pretraining network: the trunk plus the tied softmax's `output_bias`. LM: {logits
    [B, L, V]} and, given `carry`, the next `carry`; autoencoder: {logits [B, L, V]} over `targets`."""

    def setup(self):
        super().setup()
        self.output_bias = self.param("output_bias", nn.initializers.zeros, (self.cfg.vocab_size,))
        self.dropout = nn.Dropout(self.cfg.dropout_rate)

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        out = {}
        if self.cfg.kind == "autoencoder":
            ids, at = decoder_after_sentence(batch)
            layers, _ = self.read(ids, deterministic)
            top = jnp.take_along_axis(layers[-1], at[..., None], axis=1)
        else:
            layers, final = self.read(batch["input_ids"], deterministic, batch.get("carry"))
            top = layers[-1]
            if "carry" in batch:
                out["carry"] = final
        return {"logits": self.softmax(top, deterministic), **out}

    def softmax(self, x: Array, deterministic: bool = True) -> Array:
        """The tied softmax's logits [..., V] float32 of top-layer outputs x [..., P] (dropout first)."""
        return self.embed.attend(self.dropout(x, deterministic=deterministic)).astype(jnp.float32) + self.output_bias


def trunk(params: dict) -> dict:
    """The token table and the LSTM stack: everything but the output bias."""
    return {k: v for k, v in params.items() if k != "output_bias"}


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The LSTM stack and the tied softmax per word (nominal the same); the autoencoder reads
    every word twice (encoder, then decoder) and predicts it once."""
    cfg = encoder_config(config_.model)
    reads = 2 if cfg.kind == "autoencoder" else 1
    return flops.TRAIN * (reads * elmo.stack_flops(cfg, cfg.projection_dim) + 2 * cfg.projection_dim * cfg.vocab_size)


# no Houlsby adapters in an LSTM: fine-tuned in full or as frozen features
FAMILY = Family(Model, trunk, flops_per_token, config=config, task_modes=("full", "features"), task_trunk=task_trunk,
                initial_carry=initial_carry)
