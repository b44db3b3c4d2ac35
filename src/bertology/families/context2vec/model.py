"""context2vec (Melamud, Goldberger & Dagan 2016, "context2vec: Learning Generic Context Embedding
with Bidirectional LSTM"; github.com/orenmel/context2vec).

A word's context is the sentence around it without the word: a left-to-right LSTM reads the words
before it (from a start token), a right-to-left LSTM the words after it (from an end token), and
a two-layer perceptron (ReLU) merges the two states into the context vector. Training pulls the
context vector towards the embedding of the word that fills the slot and pushes it from sampled
words (word2vec's negative sampling; `objective.py`). The reference's `BiLstmContext` with
`deep=yes`: each direction its own word embeddings (`unit` wide), LSTMs and target embeddings
twice as wide, the perceptron's hidden layer as wide as both states.

Rows are `[CLS] words [SEP]` (padding behind): [CLS] and [SEP] are the start and end tokens, and
the context of position i is [left state after i - 1; right state after i + 1]. The LSTMs are
ELMo's (`families/elmo/model.py`, `LSTMStack`), whose cell ends in a projection: here one as wide
as the cell, a linear map the reference's plain LSTM does not have.

Downstream (`TaskTrunk`): each token's features are its context vector; `pooled`, what sentence
heads read, is their mean over the sentence's words.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.families.elmo import model as elmo
from bertology.models import Family, block_fields, encoder_config, flops
from bertology.models.tasks import masked_mean

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Context2VecConfig:
    """The reference's sizes from its `unit` (the word embedding): LSTMs and targets 2 × unit."""

    vocab_size: int
    embedding_dim: int = 300
    lstm_dim: int = 600
    target_dim: int = 600
    n_layers: int = 1
    dropout_rate: float = 0.0
    # What ELMo's LSTMStack reads besides the above: a square projection, no clipping, no residual.
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    use_skip_connections: bool = False

    @property
    def projection_dim(self) -> int:
        return self.lstm_dim


def config(model_config: Any) -> Context2VecConfig:
    """The Context2VecConfig of a `model` block (every key but `family`)."""
    return Context2VecConfig(**block_fields(model_config, Context2VecConfig, "context2vec model"))


def words(batch: dict[str, Array]) -> Array:
    """The positions whose context is a training example: real tokens but the first and last of
    the row ([CLS] and [SEP])."""
    mask = batch["input_mask"] > 0
    inner = jnp.pad(mask[:, 2:], ((0, 0), (1, 1)))  # a token with a real token on each side
    return mask & inner


class Model(nn.Module):
    """{context [B, L, target_dim]} of every position; `targets` ([vocab, target_dim]) are the
    embeddings the objective scores contexts against."""

    cfg: Context2VecConfig

    def setup(self):
        cfg = self.cfg
        init = nn.initializers.normal(cfg.vocab_size ** -0.5)  # the reference's N(0, 1/vocab) tables
        self.left_embed = nn.Embed(cfg.vocab_size, cfg.embedding_dim, embedding_init=init, name="left_embed")
        self.right_embed = nn.Embed(cfg.vocab_size, cfg.embedding_dim, embedding_init=init, name="right_embed")
        self.left = elmo.LSTMStack(cfg, name="left")
        self.right = elmo.LSTMStack(cfg, name="right")
        self.hidden = nn.Dense(2 * cfg.lstm_dim, name="hidden")
        self.out = nn.Dense(cfg.target_dim, name="out")
        self.targets = self.param("targets", nn.initializers.zeros, (cfg.vocab_size, cfg.target_dim))
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def contexts(self, batch: dict[str, Array], deterministic: bool) -> Array:
        ids, mask = batch["input_ids"], batch["input_mask"]
        left, _ = self.left(self.left_embed(ids), elmo.piece_starts(mask), deterministic)
        flipped = jnp.flip(mask, axis=1)  # the row read from its end: padding first, then [SEP] ... [CLS]
        right, _ = self.right(jnp.flip(self.right_embed(ids), axis=1), elmo.piece_starts(flipped), deterministic)
        before = jnp.pad(left[-1][:, :-1], ((0, 0), (1, 0), (0, 0)))  # position i reads the state after i - 1
        after = jnp.pad(jnp.flip(right[-1], axis=1)[:, 1:], ((0, 0), (0, 1), (0, 0)))  # ... and after i + 1
        h = self.dropout(jnp.concatenate([before, after], -1), deterministic=deterministic)
        h = self.dropout(nn.relu(self.hidden(h)), deterministic=deterministic)
        return self.out(h)

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        return {"context": self.contexts(batch, deterministic), "targets": self.targets}


class TaskTrunk(Model):
    """The fine-tuning trunk: {sequence: each token's context vector, pooled: their mean over the
    row's words, layers: [sequence]}."""

    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Any]:
        sequence = self.contexts(batch, deterministic)
        return {"sequence": sequence, "pooled": masked_mean(sequence, words(batch)), "layers": [sequence]}


def task_trunk(cfg: Context2VecConfig, name: str) -> TaskTrunk:
    return TaskTrunk(cfg, name=name)


def trunk(params: dict) -> dict:
    """Everything: the context network and the target embeddings it was trained against."""
    return params


def flops_per_token(config_: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """Two LSTM directions, the perceptron and the 1 + negatives scored targets per word."""
    cfg = encoder_config(config_.model)
    lstm = elmo.stack_flops(cfg, cfg.embedding_dim)
    mlp = 2 * (2 * cfg.lstm_dim) ** 2 + 2 * 2 * cfg.lstm_dim * cfg.target_dim
    scores = 2 * (1 + config_.data.get("negatives", 10)) * cfg.target_dim
    return flops.TRAIN * (2 * lstm + mlp + scores)


FAMILY = Family(Model, trunk, flops_per_token, config=config, task_modes=("full", "features"), task_trunk=task_trunk)
