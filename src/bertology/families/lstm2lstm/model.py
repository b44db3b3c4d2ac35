"""LSTM2LSTM: Ramachandran, Liu & Le 2017 ("Unsupervised Pretraining for Sequence to Sequence
Learning"), the paper's own LSTM version (GPT2GPT is its Transformer version).

An attentional LSTM encoder-decoder whose lower layers are two word-level LSTM language models
(`families/lstm`, kind `lm`; §2.1): the source-side LM gives the encoder its embedding and LSTM
layers, the target-side LM gives the decoder its embedding, LSTM layers and softmax (tied to its
embedding, plus its output bias); the layers above them start fresh. `combine.py` writes such a run
from the two LM runs (one run may serve both sides, as the paper's summariser does).

The paper's LMs have one LSTM layer, so what it says of "the first layer" is said here of the LM's
layers: `model.lm_layers` (the LM runs' `n_layers`; 1 in the paper) of each side's `model.n_layers`
come from the LM, and an LM of two layers plays the first layer's part whole, so that the LM
passes below compute exactly the LM that was pretrained. Every layer is ELMo's LSTM cell with a
projection (`elmo.lstmp_step`, the LM's), residual between the fresh layers when
`use_skip_connections`.

- Encoder: the source LM's embedding and layers over the source, then the fresh layers
  (`elmo.LSTMStack`); a unidirectional encoder, as the source LM is.
- Decoder: the target LM's layers over the target words (they read nothing else, as pretrained),
  then the fresh layers, the first also reading the attentional state h~ of the step before
  (input feeding, as CoVe's decoder: `families/cove/model.py`, whose pieces this reuses).
- Multi-layer attention (§2.3): α from the top decoder state over the encoder's top layer,
  applied to both the encoder's first (LM) layer and its top layer: c_t = [c_t^1; c_t^L], then
  Luong's h~_t = tanh(W2 [c_t^1; c_t^L; h_t] + b2) (`cove.attend`).
- Residual (§2.3): the softmax reads h~_t plus the decoder's first-layer (LM) output, so that the
  fresh layers' noise at the start does not drown what the target LM predicts.
- The LM regularisers (§2.2; the objective is GPT2GPT's, `families/gpt2gpt/objective.py`):
  `source_lm` and `target_lm` run each side's embedding, LM layers and softmax on the same
  parameters, i.e. the two LMs as pretrained (the source LM's output bias is kept for this alone).

Dropout is where the LM has it (each LM layer's input, the softmax's input) and on the encoder's
fresh layers' inputs; the decoder's recurrence has none (as CoVe's). Generation decodes against a
cache (CoVe's way, `cove.DECODING`): the encoder states under `cross_attention`, the target LM's
LSTM states, the fresh layers' and h~. The decoder starts from EOS (`[SEP]`): the LMs' word
stream ends every document with it, so the target LM reads it as "a text starts here".
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.errors import UserError
from bertology.families.cove import model as cove
from bertology.families.elmo import model as elmo
from bertology.families.gpt2gpt import objective
from bertology.families.lstm import model as lstm
from bertology.models import Family, block_fields, encoder_config, flops

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Lstm2LstmConfig(lstm.LSTMConfig):
    """The LM's fields (`lstm.LSTMConfig`: its vocabulary, cell shapes, clips, residual, dropout;
    `kind` is `lm`), `lm_layers` of the LM's and `n_layers` in all on each side."""

    n_layers: int = 2
    lm_layers: int = 1
    # What generation reads of a model's config: no position table to outgrow, no scanned stack.
    positions: ClassVar[str] = "none"
    scan_layers: ClassVar[bool] = False

    def lm(self) -> lstm.LSTMConfig:
        """Each side's language model: what the LM runs are."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(lstm.LSTMConfig)}
        return lstm.LSTMConfig(**{**fields, "n_layers": self.lm_layers})

    def upper(self) -> lstm.LSTMConfig:
        """The fresh layers above it, a stack of the same cell."""
        return dataclasses.replace(self.lm(), n_layers=self.n_layers - self.lm_layers)


def config(model_config: Any) -> Lstm2LstmConfig:
    """The Lstm2LstmConfig of a `model` block (every key but `family`)."""
    cfg = Lstm2LstmConfig(**block_fields(model_config, Lstm2LstmConfig, "LSTM2LSTM model"))
    if cfg.kind != "lm":
        raise UserError(f"model.kind={cfg.kind!r}: both sides of an LSTM2LSTM are language models; leave model.kind out")
    if not 1 <= cfg.lm_layers < cfg.n_layers:
        raise UserError(f"model.n_layers={cfg.n_layers} with model.lm_layers={cfg.lm_layers}: each side is the LM's "
                        "layers (at least 1) and fresh ones above them; set model.n_layers > model.lm_layers >= 1")
    return cfg


def start(cfg: Lstm2LstmConfig, rows: int, dtype: Any = jnp.float32) -> dict[str, Any]:
    """The decoder's zero state for `rows` rows: the target LM's {c, h} (`lm`), the fresh layers'
    c, h [rows, layers, ...] and h~ (`feed`)."""
    zeros = lambda layers, width: jnp.zeros((rows, layers, width), dtype)  # noqa: E731
    p, upper = cfg.projection_dim, cfg.n_layers - cfg.lm_layers
    return {"lm": {"c": zeros(cfg.lm_layers, cfg.lstm_dim), "h": zeros(cfg.lm_layers, p)},
            "c": zeros(upper, cfg.lstm_dim), "h": zeros(upper, p), "feed": jnp.zeros((rows, p), dtype)}


def decoder_step(cfg: Lstm2LstmConfig, weights: dict[str, Array], state: dict[str, Array], x: Array,
                 memory: dict[str, Array]) -> tuple[dict[str, Array], Array]:
    """One step of the decoder's fresh layers and attention (module docstring) from `state` {c, h,
    feed} on the target LM's output x [batch, P], against `memory` {first, top [batch, length, P],
    mask}: (the next state, the softmax's input h~ + x)."""
    below, read = x, jnp.concatenate([x, state["feed"]], axis=-1)
    cs, hs = [], []
    for k in range(cfg.n_layers - cfg.lm_layers):
        c, h = cove.layer_step(weights, k, state, read, cfg.cell_clip, cfg.proj_clip)
        below = read = h + below if cfg.use_skip_connections and k > 0 else h
        cs.append(c)
        hs.append(h)
    h_tilde, _ = cove.attend(weights, below, memory["top"], memory["mask"], (memory["first"], memory["top"]))
    return {"c": jnp.stack(cs, 1), "h": jnp.stack(hs, 1), "feed": h_tilde}, h_tilde + x


class AttentionDecoder(nn.Module):
    """The decoder's fresh layers and attention weights (`decoder_step`'s names) and its
    teacher-forced scan."""

    cfg: Lstm2LstmConfig

    def setup(self):
        cfg, p = self.cfg, self.cfg.projection_dim
        inputs = [2 * p] + [p] * (cfg.n_layers - cfg.lm_layers - 1)  # the first also reads h~ of the step before
        self.weights = {**cove.stack_weights(self, inputs, cfg.lstm_dim, p), **cove.attention_weights(self, p, p, 3 * p, p)}

    def step(self, state: dict[str, Array], x: Array, memory: dict[str, Array]) -> tuple[dict[str, Array], Array]:
        return decoder_step(self.cfg, self.weights, state, x, memory)

    def __call__(self, x: Array, memory: dict[str, Array]) -> Array:
        """The softmax's inputs [batch, targets, P] of every teacher-forced step from the zero state."""
        zero = {k: v for k, v in start(self.cfg, x.shape[0], x.dtype).items() if k != "lm"}
        _, out = jax.lax.scan(lambda state, x_t: decoder_step(self.cfg, self.weights, state, x_t, memory), zero,
                              jnp.swapaxes(x, 0, 1))
        return jnp.swapaxes(out, 0, 1)


class Model(nn.Module):
    """{logits [batch, targets, vocab]} of a seq2seq batch (`input_ids`, `input_mask`,
    `decoder_input_ids`); `source_lm` and `target_lm` are the two LMs' logits (the objective's
    regularisers), `decoding_cache` and `next_token` the incremental decoding (`cove.DECODING`)."""

    cfg: Lstm2LstmConfig
    decoding = cove.DECODING  # class constants (no annotation), not module fields
    decoder_start = "eos"

    def setup(self):
        cfg = self.cfg
        self.source = lstm.Model(cfg.lm(), name="source")  # the source LM run's parameters
        self.encoder = elmo.LSTMStack(cfg.upper(), name="encoder")
        self.target = lstm.Model(cfg.lm(), name="target")  # the target LM run's parameters
        self.decoder = AttentionDecoder(cfg, name="decoder")

    def encode(self, batch: dict[str, Array], deterministic: bool = True) -> dict[str, Array]:
        """What attention reads: {first: the source LM's top layer, top: the top fresh layer
        [batch, length, P], mask: `input_mask`}."""
        layers, _ = self.source.read(batch["input_ids"], deterministic)
        upper, _ = self.encoder(layers[-1], jnp.zeros(batch["input_ids"].shape, bool), deterministic)
        return {"first": layers[-1], "top": upper[-1], "mask": batch["input_mask"]}

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        memory = self.encode(batch, deterministic)
        layers, _ = self.target.read(batch["decoder_input_ids"], deterministic)
        return {"logits": self.target.softmax(self.decoder(layers[-1], memory), deterministic)}

    def source_lm(self, batch: dict[str, Array], *, deterministic: bool = True) -> Array:
        """Next-token logits over the source (`input_ids`): the source LM."""
        return self.source({"input_ids": batch["input_ids"]}, deterministic=deterministic)["logits"]

    def target_lm(self, batch: dict[str, Array], *, deterministic: bool = True) -> Array:
        """Next-token logits over the decoder input (`decoder_input_ids`) without the source: the target LM."""
        return self.target({"input_ids": batch["decoder_input_ids"]}, deterministic=deterministic)["logits"]

    def decoding_cache(self, batch: dict[str, Array]) -> dict[str, Any]:
        """What decoding starts from: the encoded source (`cross_attention`) and the decoder's zero state."""
        memory = self.encode(batch)
        return {"cross_attention": memory, **start(self.cfg, memory["top"].shape[0], memory["top"].dtype)}

    def next_token(self, cache: dict[str, Any], token: Array) -> tuple[Array, dict[str, Any]]:
        """(logits [rows, vocab] float32 after feeding `token` [rows], the cache after it)."""
        layers, lm_state = self.target.read(token[:, None], True, cache["lm"])
        state = {k: cache[k] for k in ("c", "h", "feed")}
        state, out = self.decoder.step(state, layers[-1][:, 0], cache["cross_attention"])
        return self.target.softmax(out), {**cache, "lm": lm_state, **state}


def trunk(params: dict) -> dict:
    """The encoder side: the source LM and the encoder's fresh layers."""
    return {k: params[k] for k in ("source", "encoder")}


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Per source token: the encoder (the source LM's layers, the fresh ones) and, for each target
    token (the run's target/source length ratio of them), the decoder's layers (the first fresh one
    also reading h~), the attention (W1 h, the scores over every source position, the two contexts,
    W2) and the softmax; and the LM regularisers' passes (layers and softmax over each side) where
    their weights (1.0 unless the config sets them) are not 0."""
    cfg = encoder_config(config_.model)
    p, length = cfg.projection_dim, config_.data.max_seq_length
    lm = elmo.stack_flops(cfg.lm(), p) + 2 * p * cfg.vocab_size  # the LM layers and the softmax
    encoder = elmo.stack_flops(cfg.lm(), p) + elmo.stack_flops(cfg.upper(), p)
    attention = 2 * p * p + 2 * length * p + 2 * 2 * length * p + 2 * 3 * p * p
    decoder = lm + elmo.stack_flops(cfg.upper(), 2 * p) + attention
    ratio = config_.data.get("max_target_length", length) / length
    source_lm, target_lm = (lm if config_.get(k, 1.0) else 0 for k in ("source_lm_weight", "target_lm_weight"))
    return flops.TRAIN * (encoder + source_lm + ratio * (decoder + target_lm))


# No fine-tuning trunk: classification reads an LSTM LM run itself (`families/lstm`), not this encoder.
FAMILY = Family(Model, trunk, flops_per_token, config=config, task_modes=(),
                seq2seq_training=objective.seq2seq_training(Model))
