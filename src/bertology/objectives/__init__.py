"""Objectives picked by name: `config.objective` names a module here that defines `loss`.

`config.objective` is a module name, or a dict {name, **options} whose options are keyword
arguments of that `loss` (e.g. ELECTRA's `disc_weight`), so an ablation stays a config change.

The contract. An objective never divides: it returns every number it reports as a weighted
mean kept as its two sums (`Mean`: Σ w·x and Σ w over the rows it was given), and says which
of them make the loss, with what coefficient. Whoever holds the whole batch divides, once: the
train step adds the sums of its k microbatches and divides each loss term by the *full batch's*
weight, so k microbatches give the full batch's loss, gradient and metrics, not an average of
k per-microbatch means; evaluation adds the sums over its batches the same way. A causal LM
(loss over `targets` with `target_weights`) is written as:

    def loss(params, batch, rng, model) -> Terms:        # rng drives dropout; None: evaluation
        logits = apply(model, params, batch, rng)        # [batch, length, vocab]
        nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
        w = batch["target_weights"]
        return Terms(loss={"lm_loss": 1.0}, means={"lm_loss": Mean.of(nll, w, eps=1e-5)})

    DERIVED = {"perplexity": lambda m: jnp.exp(m["lm_loss"])}

(`bert.mlm_means(logits, targets, weights, name="lm")` gives that loss and an accuracy, for any
token predictions.) The train step, evaluation, log line and TensorBoard then show `loss`,
`lm_loss` and `perplexity` with no change anywhere else.

Rules that make this exact:
  * A loss term's weights count what the batch asks to predict (masked slots, real tokens,
    labelled rows), never anything the parameters or `rng` decide: the step reads the full
    batch's weights before it takes any gradient, from a pass over the objective whose model
    computation XLA removes as unused. (Metrics other than loss terms may weigh anything.)
  * `eps` keeps a denominator's convention: BERT divides by Σw + 1e-5, a plain mean by Σw
    (0 when Σw = 0). It is a constant of the term, added once to the full batch's weight.
  * Coefficients are Python numbers (config options at most), not arrays.
  * `DERIVED` (optional) maps a metric name to a function of the divided metrics ("loss" and
    every mean): it runs after aggregation, so perplexity is exp(the mean loss over all
    batches), never a mean of per-batch exps.

`get` binds the options and returns an `Objective`; called like a loss function,
`objective(params, batch, rng, model)` gives one batch's (loss, metrics).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Any, Callable, Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bertology.errors import UserError
from bertology.models.transformer import TransformerConfig

Array = jax.Array


@flax.struct.dataclass
class Mean:
    """A weighted mean as its parts: total = Σ w·x, weight = Σ w; means of several batches add."""

    total: Array
    weight: Array
    eps: float = flax.struct.field(pytree_node=False, default=0.0)

    @classmethod
    def of(cls, values: Array, weights: Array | None = None, eps: float = 0.0) -> "Mean":
        """The mean of `values` weighted by `weights` (None: every element weighs 1)."""
        values = jnp.asarray(values, jnp.float32)
        if weights is None:
            return cls(jnp.sum(values), jnp.asarray(values.size, jnp.float32), eps)
        w = jnp.asarray(weights, jnp.float32)
        return cls(jnp.sum(values * w), jnp.sum(w), eps)

    def value(self, weight: Array | None = None) -> Array:
        """total / (weight + eps), with the full batch's `weight` when given; 0 when that is 0."""
        d = (self.weight if weight is None else weight) + self.eps
        return self.total / jnp.where(d > 0, d, 1.0)


@jax.tree_util.register_pytree_node_class
class Terms:
    """What an objective returns: `means` by name, and the loss as {name: coefficient} over them.

    `carry` (optional) is state a recurrent family hands to its next batch (Transformer-XL's
    memory, ELMo's LSTM states): a pytree of arrays whose leading axis is the batch row, with the
    structure and shapes of the `batch["carry"]` it was given, gradient stopped.
    """

    def __init__(self, loss: Mapping[str, float], means: Mapping[str, Mean], carry: Any = None):
        missing = sorted(set(loss) - set(means))
        if missing:
            raise ValueError(f"loss terms {missing} have no mean")
        self.loss = dict(loss)
        self.means = dict(means)
        self.carry = carry

    def tree_flatten(self) -> tuple[tuple[dict[str, Mean], Any], tuple[tuple[str, float], ...]]:
        return (self.means, self.carry), tuple(self.loss.items())

    @classmethod
    def tree_unflatten(cls, loss: tuple[tuple[str, float], ...], children: tuple[dict[str, Mean], Any]) -> "Terms":
        return cls(dict(loss), children[0], children[1])

    def weights(self) -> dict[str, Array]:
        """Each loss term's weight: what the train step divides every microbatch's term by."""
        return {name: self.means[name].weight for name in self.loss}

    def loss_value(self, weights: Mapping[str, Array] | None = None) -> Array:
        """Σ coefficient · term, each term divided by `weights[name]` (the full batch's) or its own weight."""
        return sum(c * self.means[name].value(None if weights is None else weights[name]) for name, c in self.loss.items())


def token_nll(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Each token's cross-entropy under [.., vocab] `logits`, and whether its label's logit is the
    row's maximum (an exact tie counts as correct).

    Accuracy compares the label's logit with the row's maximum (which the log-sum-exp computes
    anyway) instead of running an argmax, a second pass over the [.., vocab] logits that cost 6%
    of a BERT-mini step on CPU.
    """
    logits = logits.astype(jnp.float32)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    nll = jax.nn.logsumexp(logits, axis=-1) - label_logit
    return nll, label_logit >= jnp.max(logits, axis=-1)


def token_means(nll: Array, correct: Array, weights: Array, name: str) -> dict[str, Mean]:
    """`{name}_loss` and `{name}_accuracy` of per-token `token_nll` results, divided (as in BERT)
    by sum(w) + 1e-5; padded slots carry weight 0."""
    return {f"{name}_loss": Mean.of(nll, weights, eps=1e-5), f"{name}_accuracy": Mean.of(correct, weights, eps=1e-5)}


def chunked_token_nll(states: Array, table: Array, labels: Array, cfg: TransformerConfig,
                      chunk_tokens: int) -> tuple[Array, Array]:
    """`token_nll` of the tied output layer's logits `cfg.real_logits(states @ table.T)` without
    ever holding all [batch, length, vocab] of them: `chunk_tokens` tokens at a time (every row,
    `chunk_tokens // batch` positions of each, so a batch-sharded input stays sharded per chunk).

    `states` [batch, length, H] and `labels` [batch, length]; `table` [padded vocab, H]. Each
    chunk is `tied_logits_nll`: a product in the compute dtype with a float32 result and a
    float32 log-sum-exp, whose backward pass recomputes the chunk's logits instead of keeping
    them, which is what bounds the memory (Rabe & Staats 2021's chunk-and-recompute argument,
    applied to the vocabulary; Liger-Kernel's fused linear cross-entropy does the same). A batch
    within one chunk is computed in one piece, so the numbers are those of the unchunked logits.
    """
    def chunk(pieces: tuple[Array, Array]) -> tuple[Array, Array]:
        h, y = pieces
        return tied_logits_nll(h.astype(cfg.compute_dtype), table, y, cfg.vocab_size)

    rows, length = labels.shape
    step = max(1, chunk_tokens // rows)
    if length <= step:
        return chunk((states, labels))
    pad = -length % step
    states = jnp.pad(states, ((0, 0), (0, pad), (0, 0)))
    labels = jnp.pad(labels, ((0, 0), (0, pad)))
    n = (length + pad) // step
    pieces = (states.reshape(rows, n, step, -1).swapaxes(0, 1), labels.reshape(rows, n, step).swapaxes(0, 1))
    nll, correct = jax.lax.map(chunk, pieces)
    return tuple(x.swapaxes(0, 1).reshape(rows, -1)[:, :length] for x in (nll, correct))


def _tied_logits(h: Array, table: Array) -> Array:
    """h @ table.T in h's dtype with a float32 result, every column of the (padded) table."""
    return jnp.matmul(h, table.astype(h.dtype).T, preferred_element_type=jnp.float32)


def _real(logits: Array, vocab: int) -> Array:
    """`logits` with the padded ids' columns -inf."""
    if logits.shape[-1] == vocab:
        return logits
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab, logits, -jnp.inf)


def _tied_nll(h: Array, table: Array, labels: Array, vocab: int) -> tuple[tuple[Array, Array], Array]:
    """The masked logits feed only the two row reductions (max, then the sum of exponentials);
    the label's logit is read from the unmasked product (a label is a real id). Reading it from
    the masked logits gave the mask a third, gathering consumer, and XLA:GPU then wrote the
    masked [tokens, vocab] float32 logits out as a kernel of its own: 7.6% of GPT-2's step on
    an H100 (docs/accelerators.md, run 4)."""
    raw = _tied_logits(h, table)
    logits = _real(raw, vocab)
    top = jnp.max(logits, axis=-1)
    lse = top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
    label_logit = jnp.take_along_axis(raw, labels[..., None], axis=-1)[..., 0]
    return (lse - label_logit, label_logit >= top), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tied_logits_nll(h: Array, table: Array, labels: Array, vocab: int) -> tuple[Array, Array]:
    """`token_nll` of `h @ table.T` over the first `vocab` ids of the (padded) `table`, with a
    written-out backward pass: the logits' gradient, softmax minus one-hot, is one elementwise
    pass cast to `h`'s dtype, and both products of the backward pass run in that dtype with
    float32 accumulation. Left to autodiff, the float32 logits' gradient made both products
    float32 (TF32 on an H100: 16% of GPT-2's step) and took four passes over [tokens, vocab]
    floats (slice, pad, scatter, multiply). Only h, table, labels and the log-sum-exp are kept."""
    return _tied_nll(h, table, labels, vocab)[0]


def _tied_nll_fwd(h: Array, table: Array, labels: Array, vocab: int) -> tuple[tuple[Array, Array], tuple]:
    out, lse = _tied_nll(h, table, labels, vocab)
    return out, (h, table, labels, lse)


def _tied_nll_bwd(vocab: int, residuals: tuple, g: tuple[Array, Array]) -> tuple[Array, Array, None]:
    h, table, labels, lse = residuals
    logits = _real(_tied_logits(h, table), vocab)
    one_hot = jnp.arange(table.shape[0]) == labels[..., None]
    d = ((jnp.exp(logits - lse[..., None]) - one_hot) * g[0][..., None]).astype(h.dtype)
    dh = jnp.matmul(d, table.astype(h.dtype), preferred_element_type=jnp.float32).astype(h.dtype)
    dtable = jnp.einsum("...v,...h->vh", d, h, preferred_element_type=jnp.float32).astype(table.dtype)
    return dh, dtable, None


tied_logits_nll.defvjp(_tied_nll_fwd, _tied_nll_bwd)


def summed(parts: Sequence[Terms]) -> Terms:
    """Several batches' Terms (on the host) as one: every mean's total and weight added in
    float64, so `Objective.metrics` of the result divides once and batches weigh by what they hold."""
    return jax.tree.map(lambda *xs: np.sum(np.asarray(xs, np.float64), axis=0), *parts)


def divided(means: Mapping[str, Mean]) -> dict[str, Array]:
    """Each mean's value: for callers that want one batch's numbers rather than the sums."""
    return {name: m.value() for name, m in means.items()}


@dataclasses.dataclass(frozen=True)
class Objective:
    """An objective module's `loss` with its options bound, plus its derived metrics."""

    terms: Callable[..., Terms]  # (params, batch, rng, model) -> Terms
    derived: Mapping[str, Callable[[dict[str, Array]], Array]] = dataclasses.field(default_factory=dict)

    def metrics(self, terms: Terms) -> dict[str, Array]:
        """"loss", every mean divided by its own weight, then the derived metrics: what gets
        logged for `terms` (one batch's, or the sums over microbatches or evaluation batches)."""
        out = {"loss": terms.loss_value(), **divided(terms.means)}
        return {**out, **{name: f(out) for name, f in self.derived.items()}}

    def __call__(self, params: Any, batch: dict[str, Array], rng: Array | None, model: Any) -> tuple[Array, dict[str, Array]]:
        """One batch's (loss, metrics), every term divided by this batch's own weight."""
        terms = self.terms(params, batch, rng, model)
        return terms.loss_value(), self.metrics(terms)


def _module(name: str) -> Any:
    """The objective module called `name`: a family's own (`bertology/families/<name>/objective.py`)
    or a shared one (`bertology/objectives/<name>.py`: BERT's MLM + NSP and the losses several
    families train with)."""
    for path in (f"bertology.families.{name}.objective", f"bertology.objectives.{name}"):
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name is None or not path.startswith(e.name):
                raise
    raise UserError(f"unknown objective {name!r}; it must name a module in bertology/objectives/ or a family's "
                    "objective.py in bertology/families/")


def get(spec: str | Mapping[str, Any]) -> Objective:
    name, options = (spec, {}) if isinstance(spec, str) else (spec["name"], {k: v for k, v in dict(spec).items() if k != "name"})
    module = _module(name)
    known = [p.name for p in inspect.signature(module.loss).parameters.values() if p.kind == p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UserError(f"unknown option(s) {unknown} for objective {name!r}; valid: {known}")
    loss = functools.partial(module.loss, **options) if options else module.loss
    return Objective(loss, getattr(module, "DERIVED", {}))
