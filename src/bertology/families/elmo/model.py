"""ELMo's biLM (Peters et al. 2018) as allenai/bilm-tf builds it: not a Transformer.

Each word is read through its characters (`data/words.py` ids): a 16-d character embedding, one
convolution per (width, filters) pair max-pooled over the word, highway layers (the gate from
`W_carry`, as the reference names it), and a projection to the LSTM width when the filters add up
to another size. A forward and a backward stack of LSTMs with projections (TF's `LSTMCell` with
`num_proj`: gates i, j, f, o, forget bias 1, cell clip, then projection clip) read the sequence,
each layer after the first adding its input back (residual). Both directions share the character
encoder and the softmax over the word vocabulary, as in the reference.

Sequences are scanned over time with `jax.lax.scan`. Two ways of reading a batch:
- Stateless (features, fine-tuning): rows may hold several `<S> ... </S>` pieces (`packing_ids`,
  else `input_mask`): the state resets to zero where a piece starts, so every piece is read as if
  alone; the backward stack reads the row reversed.
- Stateful (pretraining, as bilm-tf's `train_elmo.py` trains): the batch is one segment of each
  of the lanes of the contiguous `bilm` data (`data/lanes.py`) and holds `carry`, the LSTM states
  the previous segment ended with; the stacks start from it, never reset inside the segment, and
  return their final states as `carry`, which the train step hands to the next segment
  (backpropagation truncated at the segment boundary). What is carried is what bilm-tf carries
  (its `init_lstm_state` / `final_lstm_state`): the cell state c and the projected output h of
  every LSTM layer of the forward and of the backward stack, nothing of the char CNN. As in
  bilm-tf the backward stack then reads its own stream, `backward_char_ids`: the same sentences
  each reversed (`</S> ... <S>`), left to right, so its state too is carried forward in time.

Outputs: `forward_logits` (at position t, over the word at t + 1) and `backward_logits` (over the
word at t - 1; stateful: over the next word of the backward stream), and, stateless, `layers`: the
character encoder's output duplicated, then each LSTM layer's [forward; backward] outputs, which
ELMo's scalar mix combines.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertology.data import words
from bertology.data.words import N_CHARACTERS
from bertology.errors import UserError
from bertology.models import Family, block_fields, encoder_config, flops
from bertology.models.tasks import masked_mean

Array = jax.Array
ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh}
FORGET_BIAS = 1.0  # TF LSTMCell's default, which bilm-tf keeps


@dataclasses.dataclass(frozen=True)
class ElmoConfig:
    vocab_size: int
    filters: tuple[tuple[int, int], ...] = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    char_embedding_dim: int = 16
    n_characters: int = N_CHARACTERS
    max_characters_per_token: int = 50
    activation: str = "relu"
    n_highway: int = 2
    projection_dim: int = 512
    lstm_dim: int = 4096
    n_layers: int = 2
    cell_clip: float = 3.0
    proj_clip: float = 3.0
    use_skip_connections: bool = True
    dropout_rate: float = 0.1

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def use_projection(self) -> bool:
        """bilm-tf projects the char-CNN output only when its width differs from the LSTM's."""
        return self.n_filters != self.projection_dim




def config(model_config: Any) -> ElmoConfig:
    """The ElmoConfig of a `model` block (every key but `family`)."""
    fields = block_fields(model_config, ElmoConfig, "ELMo model")
    if "filters" in fields:
        fields["filters"] = tuple((int(w), int(n)) for w, n in fields["filters"])
    if fields.get("activation", "relu") not in ACTIVATIONS:
        raise UserError(f"model.activation={fields['activation']!r} is not an ELMo char-CNN activation; use relu or tanh")
    return ElmoConfig(**fields)


def lstmp_step(params: dict[str, Array], state: tuple[Array, Array], x_proj: Array, cell_clip: float,
               proj_clip: float) -> tuple[Array, Array]:
    """One step of TF's LSTMCell with projection; `x_proj` is the input's share x @ W[:in] + b."""
    c, h = state
    d = c.shape[-1]
    z = x_proj + h @ params["kernel"][-h.shape[-1]:]
    i, j, f, o = (z[..., k * d:(k + 1) * d] for k in range(4))
    c = jax.nn.sigmoid(f + FORGET_BIAS) * c + jax.nn.sigmoid(i) * jnp.tanh(j)
    if cell_clip:
        c = jnp.clip(c, -cell_clip, cell_clip)
    h = (jax.nn.sigmoid(o) * jnp.tanh(c)) @ params["projection"]
    if proj_clip:
        h = jnp.clip(h, -proj_clip, proj_clip)
    return c, h


def lstmp_scan(params: dict[str, Array], x: Array, starts: Array, cell_clip: float, proj_clip: float,
               init: tuple[Array, Array]) -> tuple[Array, tuple[Array, Array]]:
    """The layer over [batch, length, in] inputs from the state `init` (c, h), state zeroed where
    `starts` [batch, length] is true: (outputs [batch, length, proj], the final (c, h)). The input
    projection runs for all steps at once, only the recurrence is scanned."""
    n_in = x.shape[-1]
    x_proj = x @ params["kernel"][:n_in] + params["bias"]

    def step(state, inputs):
        xp, start = inputs
        keep = (~start)[:, None].astype(xp.dtype)
        c, h = lstmp_step(params, (state[0] * keep, state[1] * keep), xp, cell_clip, proj_clip)
        return (c, h), h

    final, hs = jax.lax.scan(step, init, (jnp.swapaxes(x_proj, 0, 1), jnp.swapaxes(starts, 0, 1)))
    return jnp.swapaxes(hs, 0, 1), final


def _uniform(limit: float):
    """Uniform on [-limit, limit] (flax's `uniform` starts at 0)."""
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -limit, limit)


def piece_starts(packing_ids: Array) -> Array:
    """True where a row's piece (or its padding) begins: the LSTM state resets there."""
    previous = jnp.pad(packing_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    return packing_ids != previous


class CharCNN(nn.Module):
    """Word vectors [batch, length, projection_dim] from character ids [batch, length, chars]."""

    cfg: ElmoConfig

    @nn.compact
    def __call__(self, char_ids: Array) -> Array:
        cfg = self.cfg
        # Row k of the table is character id k + 1 (the file's 261 rows); id 0 (no word) reads zeros.
        table = self.param("char_embed", _uniform(1.0), (cfg.n_characters - 1, cfg.char_embedding_dim))
        x = jnp.where((char_ids > 0)[..., None], jnp.take(table, jnp.maximum(char_ids - 1, 0), axis=0), 0.0)
        act = ACTIVATIONS[cfg.activation]
        pooled = []
        for i, (width, num) in enumerate(cfg.filters):
            # bilm-tf's initialisers: uniform(±0.05) under relu, normal(sqrt(1 / fan-in)) under tanh.
            init = (_uniform(0.05) if cfg.activation == "relu"
                    else nn.initializers.normal((1.0 / (width * cfg.char_embedding_dim)) ** 0.5))
            kernel = self.param(f"W_cnn_{i}", init, (width, cfg.char_embedding_dim, num))
            bias = self.param(f"b_cnn_{i}", nn.initializers.zeros, (num,))
            windows = x.shape[-2] - width + 1
            conv = sum(jnp.einsum("btwc,cn->btwn", x[..., k:k + windows, :], kernel[k]) for k in range(width))
            pooled.append(act(jnp.max(conv + bias, axis=-2)))
        h = jnp.concatenate(pooled, axis=-1)
        f = cfg.n_filters
        for i in range(cfg.n_highway):
            w_carry = self.param(f"W_carry_{i}", nn.initializers.normal((1.0 / f) ** 0.5), (f, f))
            b_carry = self.param(f"b_carry_{i}", nn.initializers.constant(-2.0), (f,))
            w_transform = self.param(f"W_transform_{i}", nn.initializers.normal((1.0 / f) ** 0.5), (f, f))
            b_transform = self.param(f"b_transform_{i}", nn.initializers.zeros, (f,))
            gate = jax.nn.sigmoid(h @ w_carry + b_carry)
            h = gate * jax.nn.relu(h @ w_transform + b_transform) + (1.0 - gate) * h
        if cfg.use_projection:
            w = self.param("W_proj", nn.initializers.normal((1.0 / f) ** 0.5), (f, cfg.projection_dim))
            h = h @ w + self.param("b_proj", nn.initializers.zeros, (cfg.projection_dim,))
        return h


def initial_carry(model_config: Any, batch_size: int) -> dict[str, dict[str, np.ndarray]]:
    """Zero LSTM states for `batch_size` lanes: {forward, backward: {c [B, layers, lstm_dim],
    h [B, layers, projection_dim]}} (the carry contract: leading axis the batch row)."""
    cfg = config(model_config)
    state = lambda: {"c": np.zeros((batch_size, cfg.n_layers, cfg.lstm_dim), np.float32),  # noqa: E731
                     "h": np.zeros((batch_size, cfg.n_layers, cfg.projection_dim), np.float32)}
    return {"forward": state(), "backward": state()}


class LSTMStack(nn.Module):
    """One direction's LSTMP layers, residual after the first, from the states `state`
    ({c, h} [batch, layers, ...]; None: zeros): (every layer's output, the final states)."""

    cfg: ElmoConfig

    @nn.compact
    def __call__(self, x: Array, starts: Array, deterministic: bool,
                 state: dict[str, Array] | None = None) -> tuple[list[Array], dict[str, Array]]:
        cfg = self.cfg
        if state is None:
            state = {"c": jnp.zeros((x.shape[0], cfg.n_layers, cfg.lstm_dim), x.dtype),
                     "h": jnp.zeros((x.shape[0], cfg.n_layers, cfg.projection_dim), x.dtype)}
        outputs, finals = [], []
        for k in range(cfg.n_layers):
            n_in = x.shape[-1]
            params = {
                "kernel": self.param(f"layer_{k}_kernel", nn.initializers.glorot_uniform(),
                                     (n_in + cfg.projection_dim, 4 * cfg.lstm_dim)),
                "bias": self.param(f"layer_{k}_bias", nn.initializers.zeros, (4 * cfg.lstm_dim,)),
                "projection": self.param(f"layer_{k}_projection", nn.initializers.glorot_uniform(),
                                         (cfg.lstm_dim, cfg.projection_dim)),
            }
            inputs = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
            h, final = lstmp_scan(params, inputs, starts, cfg.cell_clip, cfg.proj_clip,
                                  (state["c"][:, k], state["h"][:, k]))
            x = h + x if cfg.use_skip_connections and k > 0 else h
            outputs.append(x)
            finals.append(final)
        return outputs, {"c": jnp.stack([c for c, _ in finals], 1), "h": jnp.stack([h for _, h in finals], 1)}


class Model(nn.Module):
    """The biLM over a batch with `char_ids` [batch, length, chars] and `packing_ids` (or
    `input_mask`) [batch, length], or, stateful, `char_ids`, `backward_char_ids` and `carry`;
    see the module docstring for the outputs."""

    cfg: ElmoConfig

    def setup(self):
        self.char_cnn = CharCNN(self.cfg, name="char_cnn")
        self.forward_lstm = LSTMStack(self.cfg, name="forward")
        self.backward_lstm = LSTMStack(self.cfg, name="backward")
        self.softmax = nn.Dense(self.cfg.vocab_size, kernel_init=nn.initializers.normal(1.0 / self.cfg.projection_dim ** 0.5),
                                name="softmax")
        self.dropout = nn.Dropout(self.cfg.dropout_rate)

    def representations(self, batch: dict[str, Array], deterministic: bool = True) -> list[Array]:
        """[x; x] from the char CNN, then [forward; backward] of each LSTM layer ([batch, length, 2P])."""
        return self._run(batch, deterministic)[2]

    def _run(self, batch: dict[str, Array], deterministic: bool) -> tuple[Array, Array, list[Array], Any]:
        """(last forward layer, last backward layer, the mixable layers or None, the final carry or None)."""
        x = self.char_cnn(batch["char_ids"])
        carry = batch.get("carry")
        if carry is not None:  # one segment of each lane: no resets, states from and to the carry
            no_starts = jnp.zeros(x.shape[:2], bool)
            fwd, fwd_state = self.forward_lstm(x, no_starts, deterministic, carry["forward"])
            bwd, bwd_state = self.backward_lstm(self.char_cnn(batch["backward_char_ids"]), no_starts, deterministic,
                                                carry["backward"])
            return fwd[-1], bwd[-1], None, {"forward": fwd_state, "backward": bwd_state}
        pieces = batch.get("packing_ids", batch.get("input_mask"))
        if pieces is None:
            pieces = (batch["char_ids"][..., 0] > 0).astype(jnp.int32)
        fwd, _ = self.forward_lstm(x, piece_starts(pieces), deterministic)
        flipped = jnp.flip(pieces, axis=1)
        bwd, _ = self.backward_lstm(jnp.flip(x, axis=1), piece_starts(flipped), deterministic)
        bwd = [jnp.flip(h, axis=1) for h in bwd]
        layers = [jnp.concatenate([x, x], axis=-1)] + [jnp.concatenate(pair, axis=-1) for pair in zip(fwd, bwd)]
        return fwd[-1], bwd[-1], layers, None

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        """{forward_logits, backward_logits} and, stateless, `layers`; stateful, `carry`."""
        fwd, bwd, layers, carry = self._run(batch, deterministic)
        logits = [self.softmax(self.dropout(h, deterministic=deterministic)).astype(jnp.float32) for h in (fwd, bwd)]
        out = {"forward_logits": logits[0], "backward_logits": logits[1]}
        return {**out, "layers": layers} if carry is None else {**out, "carry": carry}


class TaskTrunk(Model):
    """The biLM as a fine-tuning trunk (`task_trunk`): its mixable layers, with the top one as
    `sequence` and its mean over real tokens as `pooled`. It is used frozen, through the task
    model's scalar mix (its `task_modes`), so the softmax is never built."""

    def __call__(self, inputs: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        layers = self.representations(inputs, deterministic)
        return {"sequence": layers[-1], "pooled": masked_mean(layers[-1], inputs["input_mask"]), "layers": layers}


def task_trunk(cfg: ElmoConfig, name: str) -> nn.Module:
    """The fine-tuning trunk of the family contract (`bertology.models`)."""
    return TaskTrunk(cfg, name=name)


def task_inputs(cfg: ElmoConfig, tokenizer: Any, arrays: dict[str, np.ndarray],
                kind: str | None = None) -> dict[str, np.ndarray]:
    """Fine-tuning or feature rows with the `char_ids` the biLM reads (`bertology.finetune`,
    `bertology.features`).

    ELMo reads words, and its checkpoint's vocabulary is a word vocabulary (`data/words.py`): the
    shared tokenizer splits task text into words (BERT's basic punctuation split) and gives each
    word one id, so a task position *is* a word and no subword ever reaches the biLM; a word the
    vocabulary lacks becomes `[UNK]`, whose characters the CNN then reads (the word's own spelling
    is not kept: a limit of reading task text through the word vocabulary). `[CLS]` and `[SEP]`
    are read as the sentence marks `<S>` and `</S>` the biLM was trained with; padding reads no
    characters.
    """
    del kind  # every head reads the same characters
    marks = {"[CLS]": words.BOS, "[SEP]": words.EOS}
    tokens = [marks.get(t, t) for t in tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))]
    table = words.char_id_table(tokens, cfg.max_characters_per_token)
    return {**arrays, "char_ids": table[arrays["input_ids"]].astype(np.int32)}


def trunk(params: dict) -> dict:
    """Everything but the softmax: what the reference's weights.hdf5 holds and features read."""
    return {k: v for k, v in params.items() if k != "softmax"}


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Char CNN, highways and projection (twice: each direction reads its own stream), both LSTM
    stacks and both softmaxes, per word (nominal the same)."""
    cfg = encoder_config(config.model)
    chars, e, f, p = cfg.max_characters_per_token, cfg.char_embedding_dim, cfg.n_filters, cfg.projection_dim
    cnn = sum(2 * w * e * n * (chars - w + 1) for w, n in cfg.filters)
    highway = cfg.n_highway * 2 * (2 * f * f)
    projection = 2 * f * p if cfg.use_projection else 0
    lstm = stack_flops(cfg, p if cfg.use_projection else f)
    return flops.TRAIN * (2 * (cnn + highway + projection) + 2 * lstm + 2 * 2 * p * cfg.vocab_size)


def stack_flops(cfg: Any, n_in: int) -> float:
    """Forward FLOPs per token of one direction's LSTMP stack (`LSTMStack` of `cfg`) whose first
    layer reads `n_in`-wide inputs: each layer's [x, h] @ W and its projection."""
    p, d = cfg.projection_dim, cfg.lstm_dim
    return cfg.n_layers * (2 * (p + p) * 4 * d + 2 * d * p) + 2 * (n_in - p) * 4 * d


# The biLM is used frozen, through the scalar mix, as Peters et al. use it: `features` mode only.
FAMILY = Family(Model, trunk, flops_per_token, config=config, task_modes=("features",), task_trunk=task_trunk,
                task_inputs=task_inputs, task_input_keys=("char_ids",), reads_words=True, initial_carry=initial_carry)
