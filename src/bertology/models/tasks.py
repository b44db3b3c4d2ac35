"""Fine-tuning heads on the shared encoder, and the three ways of fine-tuning it.

Heads (Devlin et al. 2019, §4): sequence classification and regression read the pooled first
token; token classification reads every position (only first sub-words are labelled); extractive
QA scores each position as answer start and end; multiple choice encodes every (context, ending)
pair and scores each pooled vector with one shared unit, so the choices compete in a softmax.

Modes: `full` trains everything; `adapters` builds the encoder with Houlsby adapters (the
optimizer then trains only adapters, LayerNorms and the head); `features` freezes the encoder and
feeds the head an ELMo-style learned scalar mix of all its layers (Peters et al. 2018). A frozen
encoder's first token was trained for NSP at best, so in that mode sequence-level heads read the
mix averaged over real tokens instead.

The trunk is the shared `Encoder` unless the model's family builds its own (`task_trunk` in its
`Family` record, `bertology.models`): XLNet's relative-attention stack read at its last `<cls>`,
ELMo's biLM (features mode only, its layers through the same scalar mix). Every trunk returns
`sequence`, `pooled` (what sequence-level heads read) and `layers`. A trunk whose config is not
a `TransformerConfig` gives the heads BERT's initialisation.

`MultiTaskModel` puts one head per task on one trunk (MT-DNN), optionally with each task's
projected attention layers beside the trunk's layers (PALs); `bertology.train.multitask` trains it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertology import models
from bertology.errors import UserError
from bertology.models import task_encoders
from bertology.models.pals import PALSettings, ProjectedAttention
from bertology.models.transformer import Encoder, TransformerConfig, dense, ones, zeros
from bertology.objectives import token_nll
from bertology.tasks import kinds

Array = jax.Array
MODES = models.TASK_MODES
INPUTS = ("input_ids", "input_mask", "segment_ids")  # what every trunk reads of a row; the rest is the head's


def input_keys(family: str | None) -> tuple[str, ...]:
    """The arrays of a row that reach `family`'s trunk: the ids, mask and segments, and whatever
    its `task_inputs` hook adds (`Family.task_input_keys`: ELMo's characters, Longformer's global
    attention mask, ...); labels and the other arrays stay with the head and the loss."""
    return INPUTS + (models.family(family).task_input_keys if family else ())


class ScalarMix(nn.Module):
    """gamma · Σ_j softmax(s)_j · layer_j over the embedding output and every layer's output."""

    @nn.compact
    def __call__(self, layers: list[Array]) -> Array:
        weights = self.param("weights", zeros((None,)), (len(layers),), jnp.float32)
        gamma = self.param("gamma", ones(()), (), jnp.float32)
        mix = jnp.einsum("l,lbtd->btd", jax.nn.softmax(weights), jnp.stack(layers).astype(jnp.float32))
        return gamma * mix


def masked_mean(x: Array, mask: Array) -> Array:
    m = mask.astype(x.dtype)[..., None]
    return jnp.sum(x * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def check_fine_tunable(family: str) -> None:
    """Refuse a family whose record has no fine-tuning modes (`Family.task_modes` empty): its
    network defines no state for a head to read, and the shared Encoder is not its network."""
    if not models.family(family).task_modes:
        raise UserError(f"a {family} run has no fine-tuning trunk: nothing in its network is what a task head or "
                        "`bertology.features` reads; fine-tune a run of a family with one (e.g. gpt, xlnet, bert)")


def trunk(cfg: Any, family: str | None, name: str = "encoder") -> nn.Module:
    """The network under the heads (and what `bertology.features` reads): the family's own
    `task_trunk` where it defines one, else the shared Encoder."""
    if family:
        check_fine_tunable(family)
    build = models.family(family).task_trunk if family else None
    return Encoder(cfg, name=name) if build is None else build(cfg, name)


def check_language_model(network: nn.Module, family: str | None) -> None:
    """Refuse GPT's auxiliary language-modelling loss on a trunk that is not causal (its tied
    output layer would predict tokens it has already read)."""
    if not getattr(network, "causal", False):
        raise UserError(f"lm_weight > 0 (GPT's auxiliary language-modelling loss) needs a causal trunk, not "
                        f"{family or 'the shared encoder'}'s; set lm_weight=0")


def check_length(cfg: Any, length: int, option: str) -> None:
    """Refuse rows longer than a trunk's learned position table (`option` names the setting),
    which would otherwise read clamped positions without a word."""
    if getattr(cfg, "positions", None) == "absolute" and length > cfg.max_position_embeddings - cfg.position_offset:
        raise UserError(f"{option}={length} exceeds the trunk's {cfg.max_position_embeddings - cfg.position_offset} "
                        "positions; lower it")


def task_rows(batch: dict[str, Array], kind: kinds.Kind,
              keys: tuple[str, ...]) -> tuple[dict[str, Array], int | None, int | None]:
    """The trunk's inputs (`keys`: `input_keys` of its family) of a batch of `kind` rows, and
    (choices, readings) per example.

    A choice row holds one row per ending; several readings of one example ([batch, readings,
    length]: a pair in both orders, GPT-1's similarity input, Radford et al. 2018 §3.3) have their
    pooled states added before the head. Either way the rows reach the trunk as [batch·n, length]."""
    inputs = {k: batch[k] for k in keys if k in batch}
    choices = inputs["input_ids"].shape[1] if kind.choices else None
    readings = inputs["input_ids"].shape[1] if inputs["input_ids"].ndim == 3 and not choices else None
    if choices or readings:  # [batch, n, length, ...] -> [batch·n, length, ...]
        inputs = {k: v.reshape(-1, *v.shape[2:]) for k, v in inputs.items()}
    return inputs, choices, readings


def read_out(cfg: Any, kind: kinds.Kind, width: int, out: dict[str, Any], inputs: dict[str, Array], *, frozen: bool,
             choices: int | None, readings: int | None, deterministic: bool, dropout_rate: float | None = None,
             suffix: str = "", encoder: task_encoders.Settings | None = None) -> dict[str, Array]:
    """A head of `kind` and `width` outputs on the trunk's `out` for its `inputs` (called inside a
    module: its parameters are that module's `head{suffix}`, `mix{suffix}` for a frozen trunk,
    whose layers it mixes, and `task_encoder{suffix}` with an `encoder` between trunk and head).
    `dropout_rate` before the head; None: the trunk's."""
    # the heads' layers: a trunk that is not a Transformer gives them BERT's initialisation
    head_cfg = (cfg if isinstance(cfg, TransformerConfig)
                else TransformerConfig(vocab_size=cfg.vocab_size, dropout_rate=cfg.dropout_rate))
    mask = inputs["input_mask"]
    if frozen:
        sequence = ScalarMix(name=f"mix{suffix}")([jax.lax.stop_gradient(x) for x in out["layers"]])
        pooled = masked_mean(sequence, mask)
    else:
        sequence, pooled = out["sequence"], out["pooled"]
    if encoder is not None:
        read = task_encoders.TaskEncoder(encoder, name=f"task_encoder{suffix}")(
            sequence, mask, inputs.get("segment_ids", jnp.zeros_like(mask)), per_token=kind.per_token,
            deterministic=deterministic)
        sequence, pooled = (read, pooled) if kind.per_token else (sequence, read)
    if readings:  # only the pooled kinds' rows have them (`kinds._pairs`)
        pooled = pooled.reshape(-1, readings, pooled.shape[-1]).sum(axis=1)
    x = sequence if kind.per_token else pooled
    if kind.dropout:
        rate = head_cfg.dropout_rate if dropout_rate is None else dropout_rate
        x = nn.Dropout(rate)(x, deterministic=deterministic)
    logits = dense(head_cfg, width, ("hidden", None), f"head{suffix}")(x).astype(jnp.float32)
    return kind.outputs(logits.reshape(-1, choices) if choices else logits)


class TaskModel(nn.Module):
    """Encoder (params under `encoder`, loadable from pretraining) + one head (under `head`) of the
    task kind `kind` (`bertology.tasks.kinds`): what it reads, and what it returns, e.g. {"logits"}
    ([batch, labels]; token: [batch, length, labels]; choice: [batch, choices]; regression:
    [batch]) or, for QA, {"start_logits", "end_logits"} ([batch, length]).
    """

    cfg: Any  # the trunk's config: a TransformerConfig, or what its family's `config` gives
    kind: str
    num_labels: int  # the head's width: `kinds.of(task.kind).width(task)`
    mode: str = "full"
    family: str | None = None  # the family whose `task_trunk` builds the trunk; None: the shared Encoder
    task_encoder: task_encoders.Settings | None = None  # a BiLSTM task model under the head (`task_encoders`)

    @nn.compact
    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True,
                 language_model: bool = False) -> dict[str, Array]:
        """The head's outputs; with `language_model`, also each position's next-token
        cross-entropy through the trunk's tied output layer (`lm_nll`, [rows, length - 1]) and
        whether that next token is real (`lm_weights`): GPT's auxiliary fine-tuning loss
        (Radford et al. 2018, §3.2), which only a causal trunk can compute."""
        kind = kinds.of(self.kind)
        frozen = self.mode == "features"
        inputs, choices, readings = task_rows(batch, kind, input_keys(self.family))
        mask = inputs["input_mask"]
        network = trunk(self.cfg, self.family)
        out = network(inputs, deterministic=deterministic or frozen)
        outputs = read_out(self.cfg, kind, self.num_labels, out, inputs, frozen=frozen, choices=choices,
                           readings=readings, deterministic=deterministic, encoder=self.task_encoder)
        if language_model:
            check_language_model(network, self.family)
            next_logits = self.cfg.real_logits(network.attend(out["sequence"][:, :-1]).astype(jnp.float32))
            outputs["lm_nll"] = token_nll(next_logits, inputs["input_ids"][:, 1:])[0]
            outputs["lm_weights"] = mask[:, 1:]
        return outputs


# A multi-task batch holds one task's rows and says which task under one key, TASK + its name: a dict key
# is static under jit, so each task traces its own step, which runs that task's head (and branch) alone.
TASK = "task:"


def with_task(batch: dict[str, Any], name: str) -> dict[str, Any]:
    """`batch` marked as rows of task `name` (numpy or traced arrays alike)."""
    return {**batch, TASK + name: np.zeros(batch["input_ids"].shape[0], np.int32)}


def task_of(batch: dict[str, Any]) -> str:
    """The task a multi-task batch holds (`with_task`)."""
    names = [k[len(TASK):] for k in batch if k.startswith(TASK)]
    if len(names) != 1:
        raise ValueError(f"a multi-task batch names exactly one task ({TASK}<name>); this one names {names}")
    return names[0]


@dataclasses.dataclass(frozen=True)
class Head:
    """One task of a `MultiTaskModel`: its name, head kind and width, and the dropout before its
    head (None: the trunk's rate; MT-DNN gives some tasks their own)."""

    name: str
    kind: str
    width: int
    dropout: float | None = None


def head(heads: Sequence[Head], name: str) -> Head:
    """The task `name` among `heads`."""
    for h in heads:
        if h.name == name:
            return h
    raise ValueError(f"task {name!r} has no head; the model's tasks are {[h.name for h in heads]}")


class MultiTaskModel(nn.Module):
    """One trunk shared by every task (params under `encoder`, as `TaskModel`'s) and, per task, a
    head of the task's own kind (`head_<task>`; `mix_<task>` for a frozen trunk): MT-DNN (Liu et al.
    2019). With `pals`, each task also has projected attention layers beside the trunk's layers
    (`pals_<task>`; Stickland & Murray 2019, `bertology.models.pals`).

    A batch holds one task's rows (`with_task`); only that task's head and PALs run on it, so
    only they, and the trunk, get a gradient from it. Initialisation runs every task on the
    example batch, so that every task's parameters exist."""

    cfg: Any
    tasks: tuple[Head, ...]
    mode: str = "full"
    family: str | None = None
    pals: PALSettings | None = None

    @nn.compact
    def __call__(self, batch: dict[str, Array], *, deterministic: bool = True) -> dict[str, Array]:
        name = task_of(batch)
        frozen = self.mode == "features"
        inputs, choices, readings = task_rows(batch, kinds.of(head(self.tasks, name).kind), input_keys(self.family))
        network = trunk(self.cfg, self.family)
        running = self.tasks if self.is_initializing() else (head(self.tasks, name),)
        if self.pals is None:  # one trunk for every task
            out = network(inputs, deterministic=deterministic or frozen)
            outs = {task.name: out for task in running}
        else:
            outs = {task.name: network(inputs, deterministic=deterministic or frozen,
                                       parallel=ProjectedAttention(self.cfg, self.pals, name=f"pals_{task.name}"))
                    for task in running}
        outputs = {task.name: read_out(self.cfg, kinds.of(task.kind), task.width, outs[task.name], inputs,
                                       frozen=frozen, choices=choices, readings=readings, deterministic=deterministic,
                                       dropout_rate=task.dropout, suffix=f"_{task.name}")
                   for task in running}
        return outputs[name]
