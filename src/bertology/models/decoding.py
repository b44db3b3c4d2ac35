"""How a model is driven against its KV cache: one `Decoding` per way of decoding, which the
generation loops (`bertology.generation`) call without asking what the model is.

A model's way is `decoding_of(model)`: its class's own `decoding` where it states one (UniLM's
masked decoding, `families/unilm/model.py`), else the core's for an `EncoderDecoder` (the source is
encoded once and its cross-attention keys cached; decoding starts from a start token at position
0) or for a model whose `__call__` takes `decode` (decoder-only: the prompts share a batch by left
padding, so every row's last prompt token sits in one column, and positions come from the mask,
`max(cumsum(mask) - 1, 0)`, so a padded row sees exactly what it would alone).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp

from bertology.errors import UserError
from bertology.models.transformer import EncoderDecoder

Feed = Callable[[jax.Array, jax.Array], dict[str, jax.Array]]  # (token [rows], step) -> one step's batch


@dataclasses.dataclass(frozen=True)
class Decoding:
    """One way of decoding.

    - `transduces`: the input is a source mapped to a target (errors call it a source), not a
      prompt to continue;
    - `left_pad`: inputs are left-padded for the loop (a decoder-only prompt; UniLM's source);
    - `takes_start` / `takes_mask`: whether `decoder_start_id` (encoder-decoders) or `mask_id`
      (UniLM's `[MASK]`) is needed, and refused otherwise;
    - `prime(model, params, ids, mask, max_new_tokens, start_id, mask_id, copies)` -> (the filled
      cache with `copies` consecutive rows per input, the first token each row feeds, feed);
    - `forward(model, params, cache, piece)` -> (logits [rows, vocab] float32 of the step's last
      token, the cache after it);
    - `frame(tokenizer, ids, length)`: a tokenized source as the model reads it (and fine-tuning
      trains it), cut to fit `length`; `end_id(tokenizer)`: the token that ends an output;
    - `positions(width, longest, max_new_tokens)`: the most positions a call uses, for the check
      against a learned position table (inputs `width` wide, the longest `longest` tokens).
    """

    transduces: bool
    left_pad: bool
    takes_start: bool
    takes_mask: bool
    prime: Callable[..., tuple[Any, jax.Array, Feed]]
    forward: Callable[..., tuple[jax.Array, Any]]
    frame: Callable[[Any, list[int], int | None], list[int]]
    end_id: Callable[[Any], int]
    positions: Callable[[int, int, int], int]


def per_row(cache: Any, f: Callable[[jax.Array, int], jax.Array], scanned: bool, cross: bool = True) -> Any:
    """`f(entry, batch axis)` on the cache's per-row entries (keys, values, key masks: the batch
    axis first, after the layer axis of a scanned stack); the others (indices, positions, slots)
    have fewer axes and are shared by all rows. `cross=False` leaves cross-attention's entries as
    they are."""
    axis = 1 if scanned else 0

    def apply(path: tuple, x: jax.Array) -> jax.Array:
        if x.ndim <= axis + 1 or not cross and "cross_attention" in jax.tree_util.keystr(path):
            return x
        return f(x, axis)

    return jax.tree_util.tree_map_with_path(apply, cache)


def repeat_rows(cache: Any, copies: int, scanned: bool) -> Any:
    """Each input's cache rows repeated `copies` times (beam search's beams), consecutively."""
    return cache if copies == 1 else per_row(cache, lambda x, axis: jnp.repeat(x, copies, axis=axis), scanned)


def rewind(cache: Any) -> Any:
    """The cache with every self-attention index one slot back: the next call overwrites the last slot."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x - 1 if jax.tree_util.keystr(p).endswith("['index']") else x, cache)


def last_positions(mask: jax.Array, copies: int) -> tuple[jax.Array, jax.Array]:
    """(positions [rows, length] from a left-padded mask, each fed row's last input position [rows·copies, 1])."""
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    return positions, jnp.repeat(positions[:, -1:], copies, axis=0)


def _prime_decoder(model: Any, params: Any, ids: jax.Array, mask: jax.Array, max_new_tokens: int,
                   start_id: int | None, mask_id: int | None, copies: int) -> tuple[Any, jax.Array, Feed]:
    """The prefill takes every prompt token but the last, and its logits are never read, so XLA
    drops the vocabulary projection of the whole prompt (at 16 tokens, batch 8 and GPT-2's
    vocabulary that costs as much as a couple of decoding steps); the last prompt token is the
    first one fed."""
    rows, prompt = ids.shape
    positions, last = last_positions(mask, copies)
    ones = jnp.ones((rows * copies, 1), jnp.int32)
    # Cache slots for every token that is fed: the prompt and all new tokens but the last.
    # init's parameters are unused, so XLA drops them.
    slots = jnp.zeros((rows, prompt + max_new_tokens - 1), jnp.int32)
    cache = model.init(jax.random.key(0), {"input_ids": slots, "input_mask": jnp.ones_like(slots)}, decode=True)["cache"]
    if prompt > 1:
        piece = {"input_ids": ids[:, :-1], "input_mask": mask[:, :-1], "positions": positions[:, :-1]}
        _, variables = model.apply({"params": params, "cache": cache}, piece, decode=True, mutable=["cache"])
        cache = variables["cache"]

    def feed(token: jax.Array, step: jax.Array) -> dict[str, jax.Array]:
        return {"input_ids": token[:, None], "input_mask": ones, "positions": last + step}

    return repeat_rows(cache, copies, model.cfg.scan_layers), jnp.repeat(ids[:, -1], copies), feed


def _prime_encoder_decoder(model: Any, params: Any, ids: jax.Array, mask: jax.Array, max_new_tokens: int,
                           start_id: int | None, mask_id: int | None, copies: int) -> tuple[Any, jax.Array, Feed]:
    """The cache-creating call (a decoder input of max_new_tokens slots) runs the encoder; its
    decoder states are unused, so XLA drops them."""
    assert start_id is not None, "generation._inputs refuses an encoder-decoder call without decoder_start_id"
    rows = ids.shape[0]
    ones = jnp.ones((rows * copies, 1), jnp.int32)
    slots = jnp.zeros((rows, max_new_tokens), jnp.int32)
    batch = {"input_ids": ids, "input_mask": mask, "decoder_input_ids": slots, "decoder_input_mask": jnp.ones_like(slots)}
    _, variables = model.apply({"params": params}, batch, decode=True, mutable=["cache"])

    def feed(token: jax.Array, step: jax.Array) -> dict[str, jax.Array]:
        return {"decoder_input_ids": token[:, None], "decoder_input_mask": ones, "decoder_positions": ones * step}

    cache = repeat_rows(variables["cache"], copies, model.cfg.scan_layers)
    return cache, jnp.full((rows * copies,), start_id, jnp.int32), feed


def forward_logits(model: Any, params: Any, cache: Any, piece: dict[str, jax.Array]) -> tuple[jax.Array, Any]:
    """A model's `__call__(..., decode=True)` on one step: its last logits and the cache after it."""
    out, variables = model.apply({"params": params, "cache": cache}, piece, decode=True, mutable=["cache"])
    return out["logits"][:, -1].astype(jnp.float32), variables["cache"]


DECODER_ONLY = Decoding(
    transduces=False, left_pad=True, takes_start=False, takes_mask=False, prime=_prime_decoder,
    forward=forward_logits, frame=lambda tokenizer, ids, length: ids, end_id=lambda tokenizer: tokenizer.eos_id,
    positions=lambda width, longest, new: longest + new)

ENCODER_DECODER = Decoding(
    transduces=True, left_pad=False, takes_start=True, takes_mask=False, prime=_prime_encoder_decoder,
    forward=forward_logits,
    frame=lambda tokenizer, ids, length: ids[: None if length is None else length - 1] + [tokenizer.eos_id],
    end_id=lambda tokenizer: tokenizer.eos_id, positions=lambda width, longest, new: max(new, width))


def require(model: Any) -> Decoding:
    """`decoding_of(model)`, refused in one line for a model that cannot run against a KV cache."""
    way = decoding_of(model)
    if way is None:
        raise UserError(f"{type(model).__module__}.{type(model).__name__} is not a decoder (its __call__ takes no "
                        "decode); generate from a causal LM such as configs/gpt.py or an encoder-decoder")
    return way


def decoding_of(model: Any) -> Decoding | None:
    """How `model` decodes (module docstring); None: it cannot run against a KV cache."""
    own = getattr(type(model), "decoding", None)
    if isinstance(own, Decoding):
        return own
    if isinstance(model, EncoderDecoder):
        return ENCODER_DECODER
    if "decode" in inspect.signature(type(model).__call__).parameters:
        return DECODER_ONLY
    return None
