"""CoVe (McCann, Bradbury, Xiong & Socher 2017, "Learned in Translation: Contextualized Word
Vectors"): the encoder of an attentional LSTM translation model, whose states are then read as
word features.

The translation model (§3 of the paper):
- the source words w^x through a fixed embedding (GloVe in the paper: `model.glove`, a text file,
  see `glove.py`; without one a learned table, so the default run needs no download);
- the MT-LSTM: a two-layer bidirectional LSTM, h = MT-LSTM(GloVe(w^x)), each layer reading the
  [forward; backward] states of the layer below;
- a two-layer unidirectional LSTM decoder over the target embeddings z, fed its previous
  attentional state (h^dec_t = LSTM([z_{t-1}; h~_{t-1}], h^dec_{t-1}), starting from zeros: the
  paper gives no other start, so all it knows of the source comes through attention);
- attention α_t = softmax(H (W1 h^dec_t + b1)) over the encoder states H, the context H^T α_t
  combined with the decoder state as h~_t = tanh(W2 [H^T α_t; h^dec_t] + b2), and
  p(y_t | ...) = softmax(W_out h~_t + b_out), trained by teacher-forced cross-entropy (the shared
  `seq2seq` objective over `targets`).

The LSTMs are ELMo's cell (`families/elmo/model.py`: `lstmp_step`, `lstmp_scan`, i/j/f/o gates
with TF's forget bias of 1) with an identity projection, i.e. plain LSTMs, as CoVe's.

Features (`TaskTrunk`, what `bertology.features` and fine-tuning in `features` mode read): each
token's [embedding; top MT-LSTM layer] — the paper's CoVe(w) is the top layer's output, and the
downstream models read [GloVe(w); CoVe(w)] (§4). The lower layer is not exposed: the paper only
evaluates the top one. The trunk is frozen (`task_modes`), as the paper keeps the MT-LSTM fixed.

Generation (`bertology.generation`, the seq2seq fine-tuning's evaluation) decodes against a cache
holding the encoder states (under `cross_attention`, the same for every beam of one source, so
beam search does not reorder them) and the decoder's LSTM states and last attentional state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.families.cove import glove
from bertology.families.elmo import model as elmo
from bertology.models import Family, block_fields, decoding, encoder_config, flops
from bertology.models.tasks import masked_mean

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class CoveConfig:
    """The paper's sizes by default: 300-d embeddings, LSTMs of 300 (each encoder direction and
    the decoder), two layers each. `glove`: a GloVe text file whose rows are fixed ('' : every
    row learned); `vocab`: the vocabulary file whose tokens those rows are (the run's data.vocab)."""

    vocab_size: int
    embedding_dim: int = 300
    hidden_dim: int = 300
    n_layers: int = 2
    dropout_rate: float = 0.2
    glove: str = ""
    vocab: str = ""
    # What generation reads of a model's config: no position table to outgrow, no scanned stack.
    positions: ClassVar[str] = "none"
    scan_layers: ClassVar[bool] = False


def config(model_config: Any) -> CoveConfig:
    """The CoveConfig of a `model` block (every key but `family`)."""
    return CoveConfig(**block_fields(model_config, CoveConfig, "CoVe model"))


def lstm_weights(module: nn.Module, name: str, n_in: int, hidden: int, projection: int = 0) -> dict[str, Array]:
    """One LSTM layer's weights in `elmo.lstmp_step`'s layout: `hidden` cells projected to
    `projection` (ELMo's LSTMP); 0: the projection is the identity, a plain LSTM (CoVe's)."""
    width = projection or hidden
    glorot = nn.initializers.glorot_uniform()
    return {"kernel": module.param(f"{name}_kernel", glorot, (n_in + width, 4 * hidden)),
            "bias": module.param(f"{name}_bias", nn.initializers.zeros, (4 * hidden,)),
            "projection": module.param(f"{name}_projection", glorot, (hidden, projection)) if projection
            else jnp.eye(hidden)}


def stack_weights(module: nn.Module, inputs: list[int], hidden: int, projection: int = 0) -> dict[str, Array]:
    """`lstm_weights` of layer k reading `inputs[k]`-wide inputs, each as `layer_{k}_<name>`
    (what `layer_step` reads)."""
    return {f"layer_{k}_{name}": w for k, n_in in enumerate(inputs)
            for name, w in lstm_weights(module, f"layer_{k}", n_in, hidden, projection).items()}


def attention_weights(module: nn.Module, query: int, memory: int, combined: int, out: int) -> dict[str, Array]:
    """`attend`'s weights: W1 [query, memory], b1, W2 [combined, out], b2."""
    glorot, zeros = nn.initializers.glorot_uniform(), nn.initializers.zeros
    return {"attention_kernel": module.param("attention_kernel", glorot, (query, memory)),
            "attention_bias": module.param("attention_bias", zeros, (memory,)),
            "combine_kernel": module.param("combine_kernel", glorot, (combined, out)),
            "combine_bias": module.param("combine_bias", zeros, (out,))}


def layer_step(weights: dict[str, Array], k: int, state: dict[str, Array], x: Array, cell_clip: float = 0.0,
               proj_clip: float = 0.0) -> tuple[Array, Array]:
    """Layer k of a stack (`stack_weights`) one step on from `state` {c, h [batch, layers, ...]}
    on the input x: its (c, h)."""
    layer = {name: weights[f"layer_{k}_{name}"] for name in ("kernel", "bias", "projection")}
    x_proj = x @ layer["kernel"][: x.shape[-1]] + layer["bias"]
    return elmo.lstmp_step(layer, (state["c"][:, k], state["h"][:, k]), x_proj, cell_clip, proj_clip)


def attend(weights: dict[str, Array], x: Array, memory: Array, memory_mask: Array,
           values: tuple[Array, ...]) -> tuple[Array, Array]:
    """Luong's attention from the decoder state x [batch, d]: α = softmax(memory (W1 x + b1)) over
    `memory` [batch, length, ·] at `memory_mask`, the contexts α^T v of each of `values` [batch,
    length, ·], h~ = tanh(W2 [contexts; x] + b2). Returns (h~, α [batch, length])."""
    scores = jnp.einsum("bld,bd->bl", memory, x @ weights["attention_kernel"] + weights["attention_bias"])
    alpha = jax.nn.softmax(jnp.where(memory_mask > 0, scores, jnp.finfo(scores.dtype).min), axis=-1)
    contexts = [jnp.einsum("bl,bld->bd", alpha, v) for v in values]
    return jnp.tanh(jnp.concatenate([*contexts, x], -1) @ weights["combine_kernel"] + weights["combine_bias"]), alpha


class WordVectors(nn.Module):
    """The source table [vocab, embedding_dim]: learned, but a GloVe file's rows fixed."""

    cfg: CoveConfig

    @nn.compact
    def __call__(self, ids: Array) -> Array:
        cfg = self.cfg
        table = self.param("embedding", nn.initializers.normal(cfg.embedding_dim ** -0.5),
                           (cfg.vocab_size, cfg.embedding_dim))
        if cfg.glove:
            vectors, found = glove.table(cfg.glove, cfg.vocab, cfg.embedding_dim)
            table = jnp.where(found[:, None], vectors, table)
        return jnp.take(table, ids, axis=0)


class MTLSTM(nn.Module):
    """The bidirectional encoder over right-padded rows: each layer's [forward; backward] states
    [batch, length, 2 · hidden_dim], the backward direction reading each row from its last real token."""

    cfg: CoveConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> list[Array]:
        cfg = self.cfg
        starts = {"forward": elmo.piece_starts(mask), "backward": elmo.piece_starts(jnp.flip(mask, axis=1))}
        zeros = jnp.zeros((x.shape[0], cfg.hidden_dim), x.dtype)
        layers = []
        for k in range(cfg.n_layers):
            x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
            states = []
            for direction, flip in (("forward", False), ("backward", True)):
                weights = lstm_weights(self, f"layer_{k}_{direction}", x.shape[-1], cfg.hidden_dim)
                read = jnp.flip(x, axis=1) if flip else x
                h, _ = elmo.lstmp_scan(weights, read, starts[direction], 0.0, 0.0, (zeros, zeros))
                states.append(jnp.flip(h, axis=1) if flip else h)
            x = jnp.concatenate(states, axis=-1)
            layers.append(x)
        return layers


def decoder_step(weights: dict[str, Array], state: dict[str, Array], z: Array, memory: Array,
                 memory_mask: Array) -> tuple[dict[str, Array], Array, Array]:
    """One decoder step (module docstring): `state` {c, h [batch, layers, hidden], feed [batch,
    hidden]: h~ of the step before}, z [batch, embedding] the previous target word, memory the
    encoder states H [batch, length, 2 · hidden] at `memory_mask`. Returns (the next state, h~_t,
    α_t [batch, length])."""
    x = jnp.concatenate([z, state["feed"]], axis=-1)
    cs, hs = [], []
    for k in range(state["c"].shape[1]):
        c, x = layer_step(weights, k, state, x)
        cs.append(c)
        hs.append(x)
    h_tilde, alpha = attend(weights, x, memory, memory_mask, (memory,))
    return {"c": jnp.stack(cs, 1), "h": jnp.stack(hs, 1), "feed": h_tilde}, h_tilde, alpha


def start(cfg: CoveConfig, rows: int, dtype: Any = jnp.float32) -> dict[str, Array]:
    """The decoder's zero state for `rows` rows (`decoder_step`'s `state`)."""
    lstm = jnp.zeros((rows, cfg.n_layers, cfg.hidden_dim), dtype)
    return {"c": lstm, "h": lstm, "feed": jnp.zeros((rows, cfg.hidden_dim), dtype)}


class AttentionDecoder(nn.Module):
    """The decoder's weights (`decoder_step`'s names) and its teacher-forced scan."""

    cfg: CoveConfig

    def setup(self):
        cfg, h = self.cfg, self.cfg.hidden_dim
        inputs = [cfg.embedding_dim + h] + [h] * (cfg.n_layers - 1)  # the first layer also reads h~ of the step before
        self.weights = {**stack_weights(self, inputs, h), **attention_weights(self, h, 2 * h, 3 * h, h)}

    def step(self, state: dict[str, Array], z: Array, memory: Array, memory_mask: Array
             ) -> tuple[dict[str, Array], Array]:
        new, h_tilde, _ = decoder_step(self.weights, state, z, memory, memory_mask)
        return new, h_tilde

    def __call__(self, z: Array, memory: Array, memory_mask: Array) -> Array:
        """h~ [batch, targets, hidden] of every teacher-forced step from the zero state."""

        def body(state, z_t):
            return decoder_step(self.weights, state, z_t, memory, memory_mask)[:2]

        _, out = jax.lax.scan(body, start(self.cfg, z.shape[0], z.dtype), jnp.swapaxes(z, 0, 1))
        return jnp.swapaxes(out, 0, 1)


def _prime(model: nn.Module, params: Any, ids: Array, mask: Array, max_new_tokens: int, start_id: int | None,
           mask_id: int | None, copies: int) -> tuple[Any, Array, decoding.Feed]:
    """The source encoded once into the model's `decoding_cache`, `copies` rows per source."""
    assert start_id is not None, "generation._inputs refuses an encoder-decoder call without decoder_start_id"
    cache = model.apply({"params": params}, {"input_ids": ids, "input_mask": mask}, method="decoding_cache")
    feed = lambda token, step: {"decoder_input_ids": token[:, None]}  # noqa: E731
    return decoding.repeat_rows(cache, copies, False), jnp.full((ids.shape[0] * copies,), start_id, jnp.int32), feed


def _forward(model: nn.Module, params: Any, cache: Any, piece: dict[str, Array]) -> tuple[Array, Any]:
    return model.apply({"params": params}, cache, piece["decoder_input_ids"][:, 0], method="next_token")


# The encoder-decoder way of the core (a source, a start token, EOS ends) for a recurrent decoder
# with its own cache: the model's `decoding_cache(batch)` (the encoder states under
# `cross_attention`, the decoder's zero state) and `next_token(cache, token)` -> (logits, cache).
DECODING = dataclasses.replace(decoding.ENCODER_DECODER, prime=_prime, forward=_forward)


class Model(nn.Module):
    """{logits [batch, targets, vocab]} of a seq2seq batch (`input_ids`, `input_mask`,
    `decoder_input_ids`); `next_token` is the incremental step (`DECODING`)."""

    cfg: CoveConfig
    decoding = DECODING  # a class constant (no annotation), not a module field

    def setup(self):
        cfg = self.cfg
        self.embed = WordVectors(cfg, name="embed")
        self.encoder = MTLSTM(cfg, name="encoder")
        self.target_embed = nn.Embed(cfg.vocab_size, cfg.embedding_dim,
                                     embedding_init=nn.initializers.normal(cfg.embedding_dim ** -0.5), name="target_embed")
        self.decoder = AttentionDecoder(cfg, name="decoder")
        self.output = nn.Dense(cfg.vocab_size, name="output")
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def encode(self, batch: dict[str, Array], deterministic: bool = True) -> tuple[Array, Array]:
        """(the source embeddings [batch, length, embedding_dim], the top MT-LSTM layer [batch, length, 2 · hidden])."""
        x = self.embed(batch["input_ids"])
        return x, self.encoder(x, batch["input_mask"], deterministic)[-1]

    def decoding_cache(self, batch: dict[str, Array]) -> dict[str, Any]:
        """What decoding starts from (`DECODING`): the encoded source and the decoder's zero state."""
        memory = self.encode(batch)[1]
        return {"cross_attention": {"memory": memory, "mask": batch["input_mask"]},
                **start(self.cfg, memory.shape[0], memory.dtype)}

    def next_token(self, cache: dict[str, Any], token: Array) -> tuple[Array, dict[str, Any]]:
        """(logits [rows, vocab] float32 after feeding `token` [rows], the cache after it)."""
        source = cache["cross_attention"]
        state = {k: cache[k] for k in ("c", "h", "feed")}
        state, h_tilde = self.decoder.step(state, self.target_embed(token), source["memory"], source["mask"])
        return self.output(h_tilde).astype(jnp.float32), {**cache, **state}

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        _, memory = self.encode(batch, deterministic)
        z = self.dropout(self.target_embed(batch["decoder_input_ids"]), deterministic=deterministic)
        h_tilde = self.decoder(z, memory, batch["input_mask"])
        return {"logits": self.output(self.dropout(h_tilde, deterministic=deterministic)).astype(jnp.float32)}


class TaskTrunk(Model):
    """The features: {sequence [batch, length, embedding_dim + 2 · hidden]: each token's
    [embedding; top MT-LSTM layer], pooled: its mean over real tokens, layers: [sequence]}."""

    def __call__(self, inputs: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        sequence = jnp.concatenate(self.encode(inputs, deterministic), axis=-1)
        return {"sequence": sequence, "pooled": masked_mean(sequence, inputs["input_mask"]), "layers": [sequence]}


def task_trunk(cfg: CoveConfig, name: str) -> TaskTrunk:
    return TaskTrunk(cfg, name=name)


def trunk(params: dict) -> dict:
    """The source table and the MT-LSTM: what CoVe is; the decoder stays behind."""
    return {k: params[k] for k in ("embed", "encoder")}


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Per source token: both encoder directions of every layer; and, for each target token (the
    run's target/source length ratio of them), the decoder's LSTMs, attention over the source
    (W1 h, the scores and the context at every source position), the combination and the softmax."""
    cfg = encoder_config(config_.model)
    e, h, n = cfg.embedding_dim, cfg.hidden_dim, cfg.n_layers
    length = config_.data.max_seq_length
    encoder = 2 * sum(2 * ((e if k == 0 else 2 * h) + h) * 4 * h for k in range(n))
    lstm = sum(2 * ((e + h if k == 0 else h) + h) * 4 * h for k in range(n))
    attention = 2 * h * 2 * h + 2 * 2 * length * 2 * h
    decoder = lstm + attention + 2 * 3 * h * h + 2 * h * cfg.vocab_size
    ratio = config_.data.get("max_target_length", length) / length
    return flops.TRAIN * (encoder + ratio * decoder)


# The MT-LSTM is read frozen, as the paper reads it (§4): `features` mode only.
FAMILY = Family(Model, trunk, flops_per_token, config=config, task_modes=("features",), task_trunk=task_trunk)
