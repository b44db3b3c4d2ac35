"""Text generation against the KV cache: decoder-only and encoder-decoder models, greedy,
sampled or beam search, each batched and compiled as one jitted program.

    tokens = generate(model, params, input_ids, input_mask, max_new_tokens=50, top_p=0.9, temperature=0.8)
    tokens = generate(t5, params, source_ids, source_mask, max_new_tokens=40, decoder_start_id=0, eos_id=1,
                      num_beams=4, length_penalty=0.6)
    texts = generate_text("runs/gpt_tiny", ["Return the"], max_new_tokens=20)
    texts = generate_text("runs/s2s_bart", ["Return the sum."], sources=True, num_beams=4)

One path for every model: the model's way of decoding (`bertology.models.decoding`: decoder-only,
encoder-decoder, or a family's own such as UniLM's) fills the cache and names the first token to
feed, then a `lax.while_loop` feeds one token per row and step. A decoder-only model's prompts
share a batch by left padding and go into the cache in one call (prefill); an encoder-decoder
(BART, T5, MASS) encodes its source once and starts from `decoder_start_id` (T5: pad, BART: EOS);
UniLM reads the next token at a `[MASK]` (`mask_id`) after the tokens so far. The loop stops
early once every row is done.

Sampling follows the usual definitions, in the usual order (Hugging Face's too): logits are
divided by the temperature; top-k keeps the k largest; top-p (the nucleus, Holtzman et al. 2020)
then keeps the smallest set of the largest-probability tokens whose probability, renormalised
after top-k, reaches p (always at least the most likely token); the token is drawn from the
softmax of what is kept. Temperature 0 is greedy (argmax).

Beam search (`num_beams` > 1) is Hugging Face's (transformers 4.57 `_beam_search`), so that its
sequences and scores can be checked against it token for token: each step keeps the 2·num_beams
best continuations of all beams by summed log-probability; those ending in EOS (or reaching
max_new_tokens) among the best num_beams become finished hypotheses scored
sum log p / length**length_penalty (length: generated tokens, EOS included), the best num_beams
others keep running. A row stops taking hypotheses once its best running beam, length-penalised at
its current length (at max_new_tokens for `early_stopping="never"` with a positive penalty),
cannot beat its worst of num_beams finished ones; `early_stopping=True` stops it as soon as it
has num_beams finished. The self-attention cache follows the beams by a gather over its batch
rows; the cross-attention cache, the same for every beam of one input, stays where it is.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertology.data import transforms
from bertology.errors import UserError
from bertology.models.decoding import decoding_of, per_row, require

NEG = -1.0e9  # Hugging Face's score of an impossible beam; kept so that the arithmetic (and ties) are theirs


def left_pad(input_ids: np.ndarray, input_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's real tokens moved to its right end (their order kept; right- or left-padded
    input alike), padding ids set to 0, and columns that are padding in every row dropped."""
    real = np.asarray(input_mask) > 0
    order = np.argsort(real, axis=1, kind="stable")  # padding first, then the real tokens in order
    ids = np.where(real, input_ids, 0)
    ids, real = np.take_along_axis(ids, order, axis=1), np.take_along_axis(real, order, axis=1)
    width = real.sum(axis=1).max()
    return ids[:, ids.shape[1] - width:].astype(np.int32), real[:, real.shape[1] - width:].astype(np.int32)


def filter_logits(logits: jax.Array, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """`logits` [batch, vocab] with -inf outside the top-k and then outside the nucleus of
    probability `top_p` (0 and 1: no filter). Ties are broken by index, as `lax.top_k` does."""
    vocab = logits.shape[-1]
    if top_k <= 0 and top_p >= 1.0:
        return logits
    values, indices = jax.lax.top_k(logits, min(top_k, vocab) if top_k > 0 else vocab)  # sorted, largest first
    if top_p < 1.0:
        probs = jax.nn.softmax(values, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability of the tokens ranked above each one
        values = jnp.where(before < top_p, values, -jnp.inf)  # the first token always has before = 0
    rows = jnp.arange(logits.shape[0])[:, None]
    return jnp.full_like(logits, -jnp.inf).at[rows, indices].set(values)


def sample(logits: jax.Array, key: jax.Array, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0) -> jax.Array:
    """One token id [batch] per row of `logits` [batch, vocab]: greedy at temperature 0, else a
    draw from softmax(filter_logits(logits / temperature))."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits.astype(jnp.float32) / temperature, top_k, top_p)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Beams:
    """Beam search's finished hypotheses, best first: `tokens` [batch, num_beams, max_new_tokens]
    (EOS-filled after each one's EOS) and `scores` [batch, num_beams] (sum of log-probabilities
    over length**length_penalty)."""

    tokens: np.ndarray
    scores: np.ndarray


def generate(model: nn.Module, params: Any, input_ids: np.ndarray, input_mask: np.ndarray, *,
             max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             eos_id: int | None = None, decoder_start_id: int | None = None, mask_id: int | None = None,
             num_beams: int = 1, length_penalty: float = 1.0, early_stopping: bool | str = False) -> np.ndarray:
    """The next `max_new_tokens` token ids [batch, max_new_tokens] after each prompt (decoder-only)
    or for each source (encoder-decoder, whose decoder starts from `decoder_start_id`; UniLM,
    which predicts at a `mask_id` token).

    `input_ids`/`input_mask` [batch, length] are the prompts or sources, padded on either side.
    After a row emits `eos_id` it keeps emitting `eos_id`. `num_beams` > 1 is beam search (see
    `beam_search`) and gives its best hypothesis. Draws depend only on `seed`, the inputs and the
    settings, so a call is reproducible.
    """
    if num_beams > 1:
        if temperature != 0.0:
            raise UserError(f"num_beams={num_beams} with temperature={temperature}: beam search is deterministic; "
                            "set temperature=0 or num_beams=1")
        return beam_search(model, params, input_ids, input_mask, num_beams=num_beams, max_new_tokens=max_new_tokens,
                           eos_id=eos_id, decoder_start_id=decoder_start_id, mask_id=mask_id,
                           length_penalty=length_penalty, early_stopping=early_stopping).tokens[:, 0]
    ids, mask = _inputs(model, input_ids, input_mask, max_new_tokens, decoder_start_id, mask_id)
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1 or num_beams < 1:
        raise UserError(f"temperature={temperature}, top_k={top_k}, top_p={top_p}, num_beams={num_beams}: need "
                        "temperature >= 0 (0: greedy), top_k >= 0 (0: off), 0 < top_p <= 1 (1: off), num_beams >= 1")
    tokens = _sample_loop(model, params, ids, mask, jax.random.key(seed), max_new_tokens=max_new_tokens,
                          temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                          eos_id=None if eos_id is None else int(eos_id), start_id=decoder_start_id,
                          mask_id=mask_id)
    return np.asarray(tokens)


def beam_search(model: nn.Module, params: Any, input_ids: np.ndarray, input_mask: np.ndarray, *, num_beams: int,
                max_new_tokens: int, eos_id: int | None = None, decoder_start_id: int | None = None,
                mask_id: int | None = None, length_penalty: float = 1.0, early_stopping: bool | str = False) -> Beams:
    """The `num_beams` best finished hypotheses of each prompt or source, best first (Hugging
    Face's beam search: see the module docstring). `length_penalty` > 0 favours longer outputs;
    `early_stopping` is False (stop when no running beam can still win), True (stop at num_beams
    finished) or "never" (with length_penalty > 0, assume a beam could run to max_new_tokens)."""
    if num_beams < 1:
        raise UserError(f"num_beams={num_beams}; use at least 1 (1: greedy)")
    if early_stopping not in (True, False, "never"):
        raise UserError(f"early_stopping={early_stopping!r}; use True, False or 'never'")
    ids, mask = _inputs(model, input_ids, input_mask, max_new_tokens, decoder_start_id, mask_id)
    vocab = model.cfg.vocab_size
    if 2 * num_beams > vocab:
        raise UserError(f"num_beams={num_beams} needs at least {2 * num_beams} tokens in the vocabulary, which has "
                        f"{vocab}; lower num_beams")
    # Hugging Face divides by a Python float (a double, then rounded): the same table here.
    divisors = (np.arange(1, max_new_tokens + 1, dtype=np.float64) ** float(length_penalty)).astype(np.float32)
    tokens, scores = _beam_loop(model, params, ids, mask, jnp.asarray(divisors), num_beams=num_beams,
                                max_new_tokens=max_new_tokens, eos_id=None if eos_id is None else int(eos_id),
                                start_id=decoder_start_id,
                                mask_id=mask_id, length_penalty=float(length_penalty), early_stopping=early_stopping)
    return Beams(np.asarray(tokens), np.asarray(scores))


def _inputs(model: nn.Module, input_ids: np.ndarray, input_mask: np.ndarray, max_new_tokens: int,
            decoder_start_id: int | None, mask_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The checked inputs as the loop takes them: left-padded where the model's way of decoding
    says so (prompts, UniLM sources), else as given (encoder-decoder sources)."""
    ids, mask = np.asarray(input_ids), np.asarray(input_mask)
    way = require(model)
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise UserError(f"input_ids {ids.shape} and input_mask {mask.shape} must both be [batch, length]")
    cfg = model.cfg
    what = "source" if way.transduces else "prompt"
    lengths = (mask > 0).sum(axis=1)
    if (lengths == 0).any():
        raise UserError(f"{what} {int(np.argmin(lengths))} has no tokens; every {what} needs at least one")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens}; ask for at least 1")
    if way.takes_start and decoder_start_id is None:
        raise UserError("an encoder-decoder needs decoder_start_id (T5: the pad id 0, BART: the EOS id)")
    if not way.takes_start and decoder_start_id is not None:
        raise UserError("decoder_start_id is for encoder-decoder models; a decoder-only model continues its prompt")
    if way.takes_mask != (mask_id is not None):
        raise UserError("mask_id is UniLM's [MASK] id, which it needs and other models do not take; pass it for "
                        "UniLM (tokenizer.mask_id) only")
    if cfg.positions == "absolute":
        context = cfg.max_position_embeddings - cfg.position_offset
        if way.positions(ids.shape[1], int(lengths.max()), max_new_tokens) > context:
            raise UserError(f"a {what} of {lengths.max()} tokens with max_new_tokens={max_new_tokens} exceeds the "
                            f"model's context of {context} positions; shorten it or lower max_new_tokens")
    if way.left_pad:
        return left_pad(ids, mask)
    return ids.astype(np.int32), (mask > 0).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature", "top_k", "top_p", "eos_id",
                                             "start_id", "mask_id"))
def _sample_loop(model: nn.Module, params: Any, ids: jax.Array, mask: jax.Array, key: jax.Array, *,
                 max_new_tokens: int, temperature: float, top_k: int, top_p: float, eos_id: int | None,
                 start_id: int | None, mask_id: int | None) -> jax.Array:
    """Greedy or sampled tokens [batch, max_new_tokens]: prime the cache, then a while loop of single-token steps."""
    batch = ids.shape[0]
    way = require(model)
    cache, first, feed = way.prime(model, params, ids, mask, max_new_tokens, start_id, mask_id, 1)

    def more(state: tuple) -> jax.Array:
        step, _, _, done, _ = state
        return (step < max_new_tokens) & ~jnp.all(done)

    def step_once(state: tuple) -> tuple:
        step, token, cache, done, out = state
        logits, cache = way.forward(model, params, cache, feed(token, step))
        token = sample(logits, jax.random.fold_in(key, step), temperature, top_k, top_p)
        if eos_id is not None:
            token = jnp.where(done, eos_id, token)
            done = done | (token == eos_id)
        return step + 1, token, cache, done, jax.lax.dynamic_update_slice(out, token[:, None], (0, step))

    out = jnp.full((batch, max_new_tokens), 0 if eos_id is None else eos_id, jnp.int32)
    state = (jnp.zeros((), jnp.int32), first, cache, jnp.zeros((batch,), bool), out)
    return jax.lax.while_loop(more, step_once, state)[-1]


def _reorder(cache: Any, rows: jax.Array, scanned: bool) -> Any:
    """The cache with its batch rows taken in the order `rows`, which only reorders rows among
    the copies of one input (beam search's beams).

    Cross-attention's entries are left as they are: they hold the encoded source, the same in
    every copy of one input, so the gather would rewrite them unchanged, yet it would copy every
    layer's source keys and values at every step (T5-small, 8 sources of 128 tokens, 4 beams:
    100 MB a step, four times the self-attention cache)."""
    return per_row(cache, lambda x, axis: jnp.take(x, rows, axis=axis), scanned, cross=False)


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [batch, n, ...] at index [batch, m] along its second axis."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(jax.jit, static_argnames=("model", "num_beams", "max_new_tokens", "eos_id", "start_id", "mask_id",
                                             "length_penalty", "early_stopping"))
def _beam_loop(model: nn.Module, params: Any, ids: jax.Array, mask: jax.Array, divisors: jax.Array, *,
               num_beams: int, max_new_tokens: int, eos_id: int | None, start_id: int | None, mask_id: int | None,
               length_penalty: float, early_stopping: bool | str) -> tuple[jax.Array, jax.Array]:
    """Beam search over rows [batch · num_beams] (each input's cache repeated num_beams times): the
    finished tokens [batch, num_beams, max_new_tokens] and scores [batch, num_beams], best first.
    `divisors[n - 1]` is n**length_penalty."""
    k, steps = num_beams, max_new_tokens
    batch = ids.shape[0]
    way = require(model)
    cache, first, feed = way.prime(model, params, ids, mask, max_new_tokens, start_id, mask_id, k)
    fill = 0 if eos_id is None else eos_id
    columns = jnp.arange(steps)
    top_half = jnp.arange(2 * k) < k  # the candidates that may finish: the best num_beams of 2·num_beams
    offsets = (jnp.arange(batch) * k)[:, None]
    penalty = lambda flag: flag.astype(jnp.float32) * NEG  # noqa: E731
    stop_when_full = early_stopping is True

    def more(state: tuple) -> jax.Array:
        step, _, _, _, _, _, _, finished, open_rows, all_hit = state
        return ((step < steps) & jnp.any(open_rows) & ~(jnp.all(finished) & stop_when_full) & ~all_hit)

    def step_once(state: tuple) -> tuple:
        step, token, cache, running, running_scores, hyps, hyp_scores, finished, open_rows, _ = state
        logits, cache = way.forward(model, params, cache, feed(token, step))
        vocab = logits.shape[-1]
        scores = jax.nn.log_softmax(logits).reshape(batch, k, vocab) + running_scores[:, :, None]
        top_scores, top = jax.lax.top_k(scores.reshape(batch, k * vocab), 2 * k)
        beam, new = top // vocab, top % vocab
        candidates = jnp.where(columns == step, new[:, :, None], _gather(running, beam))
        hits = step + 1 >= steps
        if eos_id is not None:
            hits = hits | (new == eos_id)
        hits = jnp.broadcast_to(hits, new.shape)

        keep_scores, keep = jax.lax.top_k(top_scores + penalty(hits), k)
        running, running_scores = _gather(candidates, keep), keep_scores
        cache = _reorder(cache, (offsets + _gather(beam, keep)).reshape(-1), model.cfg.scan_layers)

        just_finished = hits & top_half
        done_scores = top_scores / divisors[step]
        done_scores = done_scores + penalty(jnp.all(finished, axis=1, keepdims=True) & stop_when_full)
        done_scores = done_scores + penalty(~open_rows[:, None])
        done_scores = done_scores + penalty(~just_finished)
        hyp_scores, best = jax.lax.top_k(jnp.concatenate([hyp_scores, done_scores], axis=1), k)
        hyps = _gather(jnp.concatenate([hyps, candidates], axis=1), best)
        finished = _gather(jnp.concatenate([finished, just_finished], axis=1), best)

        hypothetical = steps if early_stopping == "never" and length_penalty > 0 else step + 1
        best_running = running_scores[:, :1] / divisors[hypothetical - 1]
        worst = jnp.where(finished, jnp.min(hyp_scores, axis=1, keepdims=True), NEG)
        open_rows = open_rows & jnp.any(best_running > worst, axis=1)
        return (step + 1, running[:, :, step].reshape(-1), cache, running, running_scores, hyps, hyp_scores,
                finished, open_rows, jnp.all(hits))

    sequences = jnp.full((batch, k, steps), fill, jnp.int32)
    state = (jnp.zeros((), jnp.int32), first, cache, sequences,
             jnp.zeros((batch, k), jnp.float32).at[:, 1:].set(NEG),  # the copies of one input start as one beam
             sequences, jnp.full((batch, k), NEG, jnp.float32), jnp.zeros((batch, k), bool),
             jnp.ones((batch,), bool), jnp.zeros((), bool))
    state = jax.lax.while_loop(more, step_once, state)
    return state[5], state[6]


def decoder_start_id(data: dict[str, Any], model: nn.Module, tokenizer: Any) -> int:
    """The id an encoder-decoder's decoder starts from: `data.decoder_start` if set, else EOS where
    the pretraining data (BART's and MASS's denoising: fairseq's convention, the transform's
    `start_token`) or the network (BART's, as its Hugging Face checkpoints) start from it, else
    the pad id (T5)."""
    start = data.get("decoder_start")
    if start is None:
        objective = data.get("objective")  # none for a run that was not pretrained here (an import)
        transform = transforms.lookup(objective) if objective else None
        eos = "eos" in (getattr(model, "decoder_start", None), getattr(transform, "start_token", None))
        start = tokenizer.eos_id if eos else tokenizer.pad_id
    return int(start)


def frame_source(model: nn.Module, tokenizer: Any, ids: list[int], length: int | None = None) -> list[int]:
    """A tokenized source as the model reads it (and fine-tuning trains it), cut so that it fits
    `length` tokens: closed with EOS for an encoder-decoder, `[CLS] source [SEP]` for UniLM."""
    return require(model).frame(tokenizer, ids, length)


def generate_text(checkpoint_dir: str | pathlib.Path, texts: list[str], *, sources: bool = False,
                  **options: Any) -> list[str]:
    """The generation for each text (up to the tokenizer's end) under the model of a run directory
    (config.json + checkpoints/, and the tokenizer its `data` names): a causal LM continues
    prompts; with `sources`, an encoder-decoder (BART, T5, MASS; the source closed with EOS, as
    fine-tuning feeds it) or UniLM (`[CLS] source [SEP]`, the target ending at `[SEP]`)
    transduces sources. `options` are `generate`'s (max_new_tokens, temperature, top_k, top_p,
    seed, num_beams, length_penalty)."""
    from bertology import models
    from bertology.data.tokenizers import for_data
    from bertology.train.checkpoint import load_params

    what = "source" if sources else "prompt"
    if not texts:
        raise UserError(f"no {what}s; give at least one")
    params, config = load_params(checkpoint_dir)
    model = models.build(config["model"])
    family = config["model"]["family"]
    way = decoding_of(model)
    if way is None:
        raise UserError(f"{checkpoint_dir} holds a model of the {family} family, which has no incremental decoding; "
                        "generate from a GPT (configs/gpt.py), an encoder-decoder (BART, T5, MASS) or a UniLM run")
    transducer = way.transduces
    if transducer != sources:
        raise UserError(f"{checkpoint_dir} holds a model of the {family} family, which " + (
            "maps a source to a target; pass --source, not --prompt" if transducer else
            "continues a prompt; pass --prompt, not --source"))
    tokenizer = for_data(config["data"])
    encoded = [tokenizer.encode(t) for t in texts]
    for i, (text, ids) in enumerate(zip(texts, encoded)):
        if not ids:
            raise UserError(f"{what} {i} ({text!r}) is empty; give some text to " + ("transduce" if sources else "continue"))
    eos = way.end_id(tokenizer)
    if transducer:
        encoded = [way.frame(tokenizer, e, config["data"].get("max_seq_length")) for e in encoded]
    if way.takes_start:
        options["decoder_start_id"] = decoder_start_id(config["data"], model, tokenizer)
    if way.takes_mask:
        options["mask_id"] = tokenizer.mask_id
    width = max(map(len, encoded))
    padded = np.array([e + [0] * (width - len(e)) for e in encoded], np.int32)
    mask = (np.arange(width)[None] < np.array([len(e) for e in encoded])[:, None]).astype(np.int32)
    options.setdefault("max_new_tokens", 50)
    tokens = generate(model, jax.device_put(params), padded, mask, eos_id=eos, **options)
    out = []
    for row in tokens.tolist():
        end = row.index(eos) if eos in row else len(row)
        out.append(tokenizer.decode(row[:end]))
    return out
