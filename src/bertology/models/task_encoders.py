"""Task encoders: a recurrent task model between a trunk's states and the head, as the pre-BERT
benchmarks used pretrained representations.

Before whole Transformers were fine-tuned, pretrained vectors fed a task model of their own.
GLUE's baselines (Wang et al. 2018, §5: two layers of 1500 per direction, an MLP classifier with
one hidden layer of 512) run a BiLSTM over the word vectors (GloVe, or ELMo's scalar mix: the
"BiLSTM+ELMo" rows) and max-pool its states into a sentence vector u; a pair's two sentences are
encoded apart, into u and v, and the classifier reads [u; v; |u − v|; u ∘ v]. The "+Attn"
variant adds attention between the words of the two sentences and a second BiLSTM with max
pooling after it: the "BiLSTM+ELMo+Attn" row. Here each word of one sentence attends to the
other's words (softmax over the dot products), and the second BiLSTM reads ESIM's enhanced
vectors [a; ã; a − ã; a ∘ ã] (Chen et al. 2017). With `finetune.task_encoder.name` set (`bilstm`,
`bilstm_attn`), the task model puts this between the trunk and the head, usually over a frozen
trunk (`mode=features`, where it reads the scalar mix); the config's sizes are small defaults,
and `configs/finetune/glue_baseline.py` sets the paper's.

A row's first sentence is its segment-0 tokens and the second its segment-1 tokens (the layout
`tasks.encode.encode_pair` writes, specials included); a row without segment-1 tokens is a
single sentence, and the classifier reads [u; 0; 0; 0], which is the single-sentence baseline's
classifier on u. Each sentence is moved to the front of its row before the BiLSTM, so padding
and the other sentence never enter its recurrence. Token-level heads (tagging, QA) read the first
BiLSTM's states over the whole row, at their positions.
"""

from __future__ import annotations

import dataclasses
import typing

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Settings:
    """One task encoder (the `finetune.task_encoder` block)."""

    attention: bool  # bilstm_attn: each sentence attends to the other, then a second BiLSTM
    hidden_size: int  # per direction
    num_layers: int  # of each BiLSTM
    classifier_hidden_size: int  # the MLP's hidden layer under the head (sequence-level heads)
    dropout_rate: float  # on each BiLSTM layer's inputs (the head's own dropout reads the MLP's output)


def settings(block: ml_collections.ConfigDict) -> Settings | None:
    """The task encoder a (validated) `finetune.task_encoder` block asks for; None for `name="none"`."""
    if block.name == "none":
        return None
    return Settings(attention=block.name == "bilstm_attn", hidden_size=block.hidden_size, num_layers=block.num_layers,
                    classifier_hidden_size=block.classifier_hidden_size, dropout_rate=block.dropout_rate)


def to_front(x: Array, keep: Array) -> tuple[Array, Array, Array]:
    """(x [b, t, d] with each row's kept positions first, in order; how many each row keeps; the
    position each came from), so that a recurrence over the front reads only the kept tokens."""
    order = jnp.argsort(~keep, axis=1, stable=True)
    return jnp.take_along_axis(x, order[..., None], axis=1), keep.sum(axis=1), order


def back_in_place(y: Array, order: Array, keep: Array) -> Array:
    """`to_front`'s inverse for its output y: each state back at its position, zero where not kept."""
    placed = jnp.zeros_like(y).at[jnp.arange(y.shape[0])[:, None], order].set(y)
    return placed * keep[..., None].astype(y.dtype)


def max_pool(x: Array, lengths: Array) -> Array:
    """The max over each row's first `lengths` states (zero for an empty row)."""
    real = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
    pooled = jnp.max(jnp.where(real[..., None], x, -jnp.inf), axis=1)
    return jnp.where(lengths[:, None] > 0, pooled, 0.0)


class BiLSTM(nn.Module):
    """`num_layers` bidirectional LSTM layers over rows whose first `lengths` steps are real."""

    hidden_size: int
    num_layers: int
    dropout_rate: float

    @nn.compact
    def __call__(self, x: Array, lengths: Array, deterministic: bool) -> Array:
        for i in range(self.num_layers):
            layer = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.hidden_size)),
                                     nn.RNN(nn.OptimizedLSTMCell(self.hidden_size)), name=f"layer_{i}")
            x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic).astype(jnp.float32)
            x = typing.cast(Array, layer(x, seq_lengths=lengths))  # outputs only (no return_carry)
        return x


def attend(a: Array, b: Array, b_lengths: Array) -> Array:
    """ã: for each of a's states, the softmax-weighted mean of b's real states under the scores
    a·b (zero where b is empty)."""
    scores = jnp.einsum("bid,bjd->bij", a, b)
    real = jnp.arange(b.shape[1])[None, None, :] < b_lengths[:, None, None]
    weights = jax.nn.softmax(jnp.where(real, scores, -jnp.inf), axis=-1)
    weights = jnp.where(b_lengths[:, None, None] > 0, weights, 0.0)
    return jnp.einsum("bij,bjd->bid", weights, b)


class TaskEncoder(nn.Module):
    """The module docstring's task model: `__call__` gives what the head reads."""

    s: Settings

    @nn.compact
    def __call__(self, sequence: Array, mask: Array, segment_ids: Array, *, per_token: bool,
                 deterministic: bool) -> Array:
        s = self.s
        encode = BiLSTM(s.hidden_size, s.num_layers, s.dropout_rate, name="bilstm")
        if per_token:
            keep = mask > 0
            front, lengths, order = to_front(sequence, keep)
            return back_in_place(encode(front, lengths, deterministic), order, keep)
        sentences = []
        for segment in (0, 1):
            front, lengths, _ = to_front(sequence, (mask > 0) & (segment_ids == segment))
            sentences.append((encode(front, lengths, deterministic), lengths))
        if s.attention:
            compose = BiLSTM(s.hidden_size, s.num_layers, s.dropout_rate, name="composition")
            (a, la), (b, lb) = sentences
            contexts = attend(a, b, lb), attend(b, a, la)
            sentences = [(compose(jnp.concatenate([x, c, x - c, x * c], -1), lx, deterministic), lx)
                         for (x, lx), c in zip(sentences, contexts)]
        (a, la), (b, lb) = sentences
        u, v = max_pool(a, la), max_pool(b, lb)
        pair = (lb > 0)[:, None].astype(u.dtype)  # a row without a second sentence: [u; 0; 0; 0]
        features = jnp.concatenate([u, pair * v, pair * jnp.abs(u - v), pair * u * v], -1)
        self.sow("intermediates", "features", features)  # what the tests read
        return nn.relu(nn.Dense(s.classifier_hidden_size, name="classifier")(features))  # the head's dropout follows
