"""Text generation from a decoder-only model: batched, one jitted program, against the KV cache.

    tokens = generate(model, params, input_ids, input_mask, max_new_tokens=50, top_p=0.9, temperature=0.8)
    texts = generate_text("runs/gpt_tiny", ["Return the"], max_new_tokens=20)

Prompts of different lengths share a batch by left padding: every row's last prompt token then
sits in the same column, so one step feeds one new column for all rows, and positions come from
the mask (`max(cumsum(mask) - 1, 0)`), so a padded row sees exactly what it would alone. The
prompt goes into the KV cache in one call (prefill); then one token per step inside a
`lax.while_loop`, all in one `jax.jit` compiled once per (model, batch, prompt length,
max_new_tokens, sampling settings). The loop stops early once every row has emitted `eos_id`.

Sampling follows the usual definitions, in the usual order (Hugging Face's too): logits are
divided by the temperature; top-k keeps the k largest; top-p (the nucleus, Holtzman et al. 2020)
then keeps the smallest set of the largest-probability tokens whose probability, renormalised
after top-k, reaches p (always at least the most likely token); the token is drawn from the
softmax of what is kept. Temperature 0 is greedy (argmax).
"""

from __future__ import annotations

import functools
import inspect
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertology.errors import UserError


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


def is_decoder(model: nn.Module) -> bool:
    """Whether `model` can run against a KV cache: its `__call__` takes `decode`."""
    return "decode" in inspect.signature(type(model).__call__).parameters


def generate(model: nn.Module, params: Any, input_ids: np.ndarray, input_mask: np.ndarray, *,
             max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             eos_id: int | None = None) -> np.ndarray:
    """The next `max_new_tokens` token ids [batch, max_new_tokens] after each prompt.

    `input_ids`/`input_mask` [batch, length] are the prompts, padded on either side. After a row
    emits `eos_id` it keeps emitting `eos_id`. Draws depend only on `seed`, the prompts and the
    settings, so a call is reproducible.
    """
    input_ids, input_mask = np.asarray(input_ids), np.asarray(input_mask)
    _check(model, input_ids, input_mask, max_new_tokens, temperature, top_k, top_p)
    ids, mask = left_pad(input_ids, input_mask)
    tokens = _generate(model, params, ids, mask, jax.random.key(seed), max_new_tokens=max_new_tokens,
                       temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                       eos_id=None if eos_id is None else int(eos_id))
    return np.asarray(tokens)


def _check(model: nn.Module, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int, temperature: float,
           top_k: int, top_p: float) -> None:
    if not is_decoder(model):
        raise UserError(f"{type(model).__module__}.{type(model).__name__} is not a decoder (its __call__ takes no "
                        "decode); generate from a causal LM such as configs/gpt.py")
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise UserError(f"input_ids {ids.shape} and input_mask {mask.shape} must both be [batch, length]")
    lengths = (mask > 0).sum(axis=1)
    if (lengths == 0).any():
        raise UserError(f"prompt {int(np.argmin(lengths))} has no tokens; every prompt needs at least one")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens}; ask for at least 1")
    cfg = getattr(model, "cfg", None)
    if cfg is not None and cfg.positions == "absolute" and lengths.max() + max_new_tokens > cfg.max_position_embeddings:
        raise UserError(f"a prompt of {lengths.max()} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
                        f"context of {cfg.max_position_embeddings} positions; shorten the prompt or lower max_new_tokens")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise UserError(f"temperature={temperature}, top_k={top_k}, top_p={top_p}: need temperature >= 0 "
                        "(0: greedy), top_k >= 0 (0: off) and 0 < top_p <= 1 (1: off)")


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature", "top_k", "top_p", "eos_id"))
def _generate(model: nn.Module, params: Any, ids: jax.Array, mask: jax.Array, key: jax.Array, *,
              max_new_tokens: int, temperature: float, top_k: int, top_p: float, eos_id: int | None) -> jax.Array:
    """Prefill, then a while loop of single-token steps; `ids`/`mask` left-padded.

    The prefill takes every prompt token but the last and its logits are never read, so XLA drops
    the vocabulary projection of the whole prompt (at 16 tokens, batch 8 and GPT-2's 50257-token
    vocabulary that costs as much as a couple of decoding steps); the last prompt token is the
    loop's first input, whose logits give the first new token.
    """
    batch, prompt = ids.shape
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    # Cache slots for every token that is fed: the prompt and all new tokens but the last.
    # init's parameters are unused, so XLA drops them.
    slots = jnp.zeros((batch, prompt + max_new_tokens - 1), jnp.int32)
    cache = model.init(jax.random.key(0), {"input_ids": slots, "input_mask": jnp.ones_like(slots)}, decode=True)["cache"]

    def forward(cache: Any, piece: dict[str, jax.Array]) -> tuple[jax.Array, Any]:
        out, variables = model.apply({"params": params, "cache": cache}, piece, decode=True, mutable=["cache"])
        return out["logits"][:, -1], variables["cache"]

    if prompt > 1:
        _, cache = forward(cache, {"input_ids": ids[:, :-1], "input_mask": mask[:, :-1], "positions": positions[:, :-1]})

    def more(state: tuple) -> jax.Array:
        step, _, _, done, _ = state
        return (step < max_new_tokens) & ~jnp.all(done)

    def step_once(state: tuple) -> tuple:
        """Feed the last token (at step 0 the prompt's last, whose column is real in every row) and pick the next."""
        step, token, cache, done, out = state
        piece = {"input_ids": token[:, None], "input_mask": jnp.ones((batch, 1), jnp.int32),
                 "positions": (positions[:, -1] + step)[:, None]}
        logits, cache = forward(cache, piece)
        token = sample(logits, jax.random.fold_in(key, step), temperature, top_k, top_p)
        if eos_id is not None:
            token = jnp.where(done, eos_id, token)
            done = done | (token == eos_id)
        return step + 1, token, cache, done, jax.lax.dynamic_update_slice(out, token[:, None], (0, step))

    out = jnp.full((batch, max_new_tokens), 0 if eos_id is None else eos_id, jnp.int32)
    state = (jnp.zeros((), jnp.int32), ids[:, -1], cache, jnp.zeros((batch,), bool), out)
    return jax.lax.while_loop(more, step_once, state)[-1]


def generate_text(checkpoint_dir: str | pathlib.Path, prompts: list[str], **options: Any) -> list[str]:
    """The continuation of each prompt (up to the tokenizer's end of text) under the causal LM of a
    run directory (config.json + checkpoints/, and the tokenizer its `data.vocab` names).
    `options` are `generate`'s (max_new_tokens, temperature, top_k, top_p, seed)."""
    from bertology import models
    from bertology.data.embedded import DEFAULT_VOCAB
    from bertology.data.tokenizers import load_tokenizer
    from bertology.train.checkpoint import load_params

    if not prompts:
        raise UserError("no prompts; give at least one")
    params, config = load_params(checkpoint_dir)
    model = models.build(config["model"])
    if not is_decoder(model):
        raise UserError(f"{checkpoint_dir} holds a {config['model']['family']} model, which is not a decoder; "
                        "generate from a causal LM run such as configs/gpt.py's")
    tokenizer = load_tokenizer(config["data"].get("vocab") or DEFAULT_VOCAB)
    encoded = [tokenizer.encode(p) for p in prompts]
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        if not ids:
            raise UserError(f"prompt {i} ({prompt!r}) is empty; give some text to continue")
    width = max(map(len, encoded))
    ids = np.array([e + [0] * (width - len(e)) for e in encoded], np.int32)
    mask = (np.arange(width)[None] < np.array([len(e) for e in encoded])[:, None]).astype(np.int32)
    options.setdefault("max_new_tokens", 50)
    tokens = generate(model, jax.device_put(params), ids, mask, eos_id=tokenizer.eos_id, **options)
    texts = []
    for row in tokens.tolist():
        end = row.index(tokenizer.eos_id) if tokenizer.eos_id in row else len(row)
        texts.append(tokenizer.decode(row[:end]))
    return texts
