"""EleutherAI's lm-evaluation-harness (lm-eval) on a bertology run: the model "bertology".

    import bertology.evaluation.harness  # registers the model with lm-eval
    lm_eval.simple_evaluate(model="bertology", model_args={"run": "runs/gpt_tiny"}, tasks=["hellaswag"])
    results = bertology.evaluation.harness.evaluate("runs/gpt_tiny", ["hellaswag"], limit=100)  # the same

`BertologyLM` answers lm-eval's three requests from a run directory (`load_run`: config.json +
checkpoints/, the tokenizer its `data` names):

- `loglikelihood`: sum log p(continuation | context) and whether greedy decoding gives exactly
  the continuation. A causal LM (GPT) reads context + continuation cut from the left to its
  `max_length` + 1 tokens, as lm-eval's own `hf` model does, so the two agree token for token; an
  encoder-decoder (T5, BART, MASS) encodes the context, framed as fine-tuning frames a source
  (closed with EOS), and its decoder is teacher-forced on the continuation from its start token;
  UniLM has no teacher-forced pass (it predicts at a `[MASK]` after the tokens so far), so its
  continuation is fed one token per step through its own decoding against the KV cache, the
  steps `bertology generate` takes.
- `loglikelihood_rolling`: the text's log-likelihood over lm-eval's disjoint windows of
  `max_length` tokens (the first conditioned on the end-of-text token).
- `generate_until`: greedy (or, with `do_sample`, sampled) `bertology.generation.generate`, cut
  at the first stop string.

Families without a decoder (BERT-style encoders, ELMo, LSTMs) cannot score a continuation and
are refused in one line. Inputs are padded to power-of-two widths and batches to `batch_size`
rows, so jit compiles one program per width, not one per request.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertology.errors import UserError
from bertology.files import atomic_write
from bertology.generation import decoder_start_id, generate
from bertology.models.decoding import DECODER_ONLY, ENCODER_DECODER, decoding_of

try:
    # lm-eval's own models first: its get_model fills only an empty registry with them, so one
    # registered before would hide "hf" and the rest (lm-eval 0.4.13).
    import lm_eval.models  # noqa: F401
    from lm_eval import simple_evaluate
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import get_rolling_token_windows, handle_non_serializable, make_disjoint_window, make_table
except ImportError:
    raise UserError('lm-eval is not installed; pip install "bertology[lm-eval]"') from None

# lm-eval's own default where a model states no length (relative positions: T5) and the run
# names no data.max_seq_length.
DEFAULT_MAX_LENGTH = 2048
SMALLEST_BUCKET = 16  # narrower widths save little and would add programs to compile


def bucket(n: int, cap: int) -> int:
    """The padded width of `n` tokens: the next power of two from SMALLEST_BUCKET, at most `cap`."""
    return min(cap, max(SMALLEST_BUCKET, 1 << math.ceil(math.log2(max(n, 1)))))


@register_model("bertology")
class BertologyLM(TemplateLM):
    """lm-eval's model over a bertology run (module docstring). `model_args`: run (the run
    directory), step (default: the latest checkpoint), batch_size, max_length (default: the
    model's position table, else the run's data.max_seq_length, else 2048), max_gen_toks."""

    def __init__(self, run: str, step: int | str | None = None, batch_size: int | str = 8,
                 max_length: int | str | None = None, max_gen_toks: int | str = 256, **_: Any) -> None:
        # `**_`: lm-eval passes device and max_batch_size to every model; jax places the arrays.
        from bertology import models
        from bertology.data.tokenizers import for_data
        from bertology.train.checkpoint import load_run

        super().__init__()
        params, config, self.step = load_run(run, None if step in (None, "") else int(step))
        self.model = models.build(config["model"])
        way = decoding_of(self.model)
        if way is None:
            raise UserError(f"{run} holds a {config['model']['family']} model, which has no decoder to score a "
                            "continuation with; evaluate a GPT (configs/gpt.py), encoder-decoder (BART, T5, MASS) "
                            "or UniLM run")
        self.way = way
        self.backend = "seq2seq" if way.transduces else "causal"  # how TemplateLM splits a pair into tokens
        self.params = jax.device_put(params)
        self.tok = for_data(config["data"])
        self.start_id = decoder_start_id(config["data"], self.model, self.tok) if way.takes_start else None
        self.mask_id = self.tok.mask_id if way.takes_mask else None
        try:
            self.batch_size = int(batch_size)
            self.max_gen_toks = int(max_gen_toks)
            asked = int(max_length) if max_length not in (None, "") else None
        except ValueError:
            raise UserError(f"batch_size={batch_size!r}, max_length={max_length!r}, max_gen_toks={max_gen_toks!r}: "
                            "each must be a whole number (batch_size 'auto' is not supported)") from None
        cfg = self.model.cfg
        table = cfg.max_position_embeddings - cfg.position_offset if cfg.positions == "absolute" else None
        limits = [n for n in (asked, table) if n]  # never past a learned position table
        self._max_length = min(limits) if limits else int(config["data"].get("max_seq_length") or DEFAULT_MAX_LENGTH)
        # What framing adds to a source (EOS; UniLM's [CLS] and [SEP]): the room it takes.
        self.frame_extra = len(way.frame(self.tok, [], None))
        # Whether the context and what follows share positions (a causal LM, UniLM; not an
        # encoder-decoder), and so the most tokens one request can score or generate.
        self.shared = way.positions(self._max_length, self._max_length, 1) > self._max_length
        self.longest = self._max_length - self.frame_extra if self.shared else self._max_length

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def eot_token_id(self) -> int:
        return int(self.way.end_id(self.tok))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The tokenizer's ids, never with specials: a source is framed when it is fed (`frame`)."""
        return list(self.tok.encode(string))

    def tok_decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))

    def _source(self, ids: list[int], room: int) -> list[int]:
        """The context as the model reads it, its last tokens kept so that it fits `room` framed."""
        return self.way.frame(self.tok, ids[max(0, len(ids) - (room - self.frame_extra)):], None)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """(sum log p, greedy) per (context ids, continuation ids), in batches of similar lengths."""
        limit = self.max_length
        rows = []
        for _, context, continuation in requests:
            if not continuation or len(continuation) > self.longest:
                raise UserError(f"a continuation of {len(continuation)} tokens; this model scores 1 to {self.longest}")
            if self.way is DECODER_ONLY:
                rows.append(((context + continuation)[-(limit + 1):], continuation))
            else:
                rows.append((self._source(context, limit - len(continuation) if self.shared else limit), continuation))
        scores: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]) - len(rows[i][1]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            batch = [rows[i] for i in chunk] + [rows[chunk[-1]]] * (self.batch_size - len(chunk))
            total, greedy = jax.device_get(self._score(batch))
            for j, i in enumerate(chunk):
                scores[i] = (float(total[j]), bool(greedy[j]))
                if requests[i][0] is not None:  # None: a window of a rolling request
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], scores[i])
        return scores

    def _score(self, batch: list[tuple[list[int], list[int]]]) -> tuple[jax.Array, jax.Array]:
        """One batch of (input, continuation) through the program of the model's way of decoding."""
        limit = self.max_length
        if self.way is DECODER_ONLY:  # (context + continuation): read all but the last, predict all but the first
            width = bucket(max(len(s) for s, _ in batch) - 1, limit)
            ids, mask = _padded([s[:-1] for s, _ in batch], width)
            targets, _ = _padded([s[1:] for s, _ in batch], width)
            ends = np.array([len(s) - 1 for s, _ in batch])[:, None]
            starts = ends - np.array([len(c) for _, c in batch])[:, None]
            weights = (np.arange(width) >= starts) & (np.arange(width) < ends)
            return _teacher_forced(self.model, self.params, {"input_ids": ids, "input_mask": mask}, targets, weights)
        targets, weights = _padded([c for _, c in batch], bucket(max(len(c) for _, c in batch), limit))
        width = bucket(max(len(s) for s, _ in batch), limit)
        if self.way is ENCODER_DECODER:
            ids, mask = _padded([s for s, _ in batch], width)
            decoder = np.concatenate([np.full((len(batch), 1), self.start_id, np.int32), targets[:, :-1]], axis=1)
            inputs = {"input_ids": ids, "input_mask": mask, "decoder_input_ids": decoder, "decoder_input_mask": weights}
            return _teacher_forced(self.model, self.params, inputs, targets, weights)
        ids, mask = _padded([s for s, _ in batch], width, left=self.way.left_pad)
        return _stepped(self.model, self.params, ids, mask, targets, weights, self.start_id, self.mask_id)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood: the sum over lm-eval's disjoint windows of max_length tokens
        (fewer for UniLM, whose framed source takes some of its positions)."""
        windows: list[tuple[tuple[str, str] | None, list[int], list[int]]] = []
        owners = []
        for i, request in enumerate(requests):
            (text,) = request.args
            pieces = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id, self.longest, 1)
            for context, continuation in map(make_disjoint_window, pieces):
                windows.append((None, context, continuation))
                owners.append(i)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owners, self._loglikelihood_tokens(windows)):
            totals[i] += logp
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each context's continuation up to its first stop string (`until`), of at most
        max_gen_toks tokens; requests of one set of options decode together."""
        outputs = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(i)
        for members in groups.values():
            options = dict(requests[members[0]].args[1])
            until = options.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            new = int(options.pop("max_gen_toks", self.max_gen_toks))
            sampling = {}
            if options.get("do_sample"):
                sampling = {"temperature": float(options.get("temperature", 1.0)), "top_k": int(options.get("top_k", 0)),
                            "top_p": float(options.get("top_p", 1.0)), "seed": int(options.get("seed", 0))}
            texts = self._generate([requests[i].args[0] for i in members], new, sampling)
            for i, text in zip(members, texts):
                cut = min([text.index(s) for s in until if s and s in text], default=len(text))
                outputs[i] = text[:cut]
                self.cache_hook.add_partial("generate_until", requests[i].args, outputs[i])
        return outputs

    def _generate(self, contexts: list[str], new: int, sampling: dict[str, Any]) -> list[str]:
        """`new` tokens after each context (up to the end token), decoded; the context's last
        tokens kept so that it and the new tokens fit max_length. `new` is cut to leave a token of
        context, as no position lies past the model's length (a task's 256 on a 128-token GPT)."""
        limit = self.max_length
        new = min(new, self.longest - 1)
        room = limit - new if self.shared else limit
        sources = [self._source(self.tok_encode(c) or [self.prefix_token_id], room) for c in contexts]
        end = self.eot_token_id
        texts = [""] * len(sources)
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            rows = [sources[i] for i in chunk] + [sources[chunk[-1]]] * (self.batch_size - len(chunk))
            ids, mask = _padded(rows, max(map(len, rows)))
            tokens = generate(self.model, self.params, ids, mask, max_new_tokens=new, eos_id=end,
                              decoder_start_id=self.start_id, mask_id=self.mask_id, **sampling)
            for i, row in zip(chunk, tokens.tolist()):
                texts[i] = self.tok_decode(row[:row.index(end)] if end in row else row)
        return texts


def _padded(rows: list[list[int]], width: int, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) [len(rows), width], each row padded with zeros on the right (or the left)."""
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        at = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, at], mask[i, at] = row, 1
    return ids, mask


def _totals(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of log p of `targets` where `weights`, whether each is the argmax there) per row of
    `logits` [batch, length, vocab]. `where`, not a product: logits past a row's end may be NaN."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    scored = weights > 0
    total = jnp.where(scored, picked, 0.0).sum(axis=1)
    return total, jnp.all((jnp.argmax(logits, axis=-1) == targets) | ~scored, axis=1)


@functools.partial(jax.jit, static_argnames="model")
def _teacher_forced(model: Any, params: Any, inputs: dict[str, Any], targets: Any,
                    weights: Any) -> tuple[jax.Array, jax.Array]:
    """One pass of a causal LM or an encoder-decoder over its whole input."""
    return _totals(model.apply({"params": params}, inputs)["logits"], targets, weights)


@functools.partial(jax.jit, static_argnames=("model", "start_id", "mask_id"))
def _stepped(model: Any, params: Any, ids: Any, mask: Any, targets: Any, weights: Any, start_id: int | None,
             mask_id: int | None) -> tuple[jax.Array, jax.Array]:
    """The continuation fed one token per step through the model's own decoding (UniLM's), as
    generation feeds the tokens it picks."""
    way = decoding_of(model)
    assert way is not None, "BertologyLM refuses a model without a way of decoding"
    cache, first, feed = way.prime(model, params, ids, mask, targets.shape[1], start_id, mask_id, 1)

    def step(carry: tuple[Any, Any], t: jax.Array) -> tuple[tuple[Any, Any], jax.Array]:
        token, cache = carry
        logits, cache = way.forward(model, params, cache, feed(token, t))
        return (targets[:, t], cache), logits

    _, logits = jax.lax.scan(step, (first, cache), jnp.arange(targets.shape[1]))
    return _totals(jnp.swapaxes(logits, 0, 1), targets, weights)


def evaluate(run: str | pathlib.Path, tasks: list[str], *, include_path: str | None = None,
             num_fewshot: int | None = None, limit: int | float | None = None, batch_size: int = 8,
             step: int | None = None) -> dict[str, Any]:
    """`simple_evaluate`'s results of the run on `tasks` (lm-eval's, or the YAML ones under
    `include_path`); an unknown task is a UserError, not lm-eval's traceback."""
    manager = task_manager(include_path, tasks)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise UserError(f"unknown lm-eval task {', '.join(unknown)}; check the name (lm-eval ls tasks) or pass "
                        "--include_path with its YAML")
    lm = BertologyLM(run=str(run), step=step, batch_size=batch_size)
    results = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, num_fewshot=num_fewshot, limit=limit,
                              log_samples=False)
    assert results is not None, "simple_evaluate returns None only on the non-zero ranks of several processes"
    return dict(results)


def task_manager(include_path: str | None, tasks: list[str]) -> TaskManager:
    """lm-eval's index of the tasks: `include_path`'s alone where it holds every task asked for,
    since indexing lm-eval's own catalogue (14,685 tasks in 0.4.13) takes 9 s on a 2-core CPU."""
    if include_path:
        own = TaskManager(include_path=include_path, include_defaults=False)
        if all(t in own.all_tasks for t in tasks):
            return own
    return TaskManager(include_path=include_path)


def describe(results: dict[str, Any]) -> str:
    """lm-eval's table of `simple_evaluate`'s results (and of its groups, where there are some)."""
    return make_table(results) + ("\n" + make_table(results, "groups") if results.get("groups") else "")


def write_results(results: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
    """`simple_evaluate`'s results as JSON, written atomically (lm-eval's own conversion of what
    JSON lacks: numpy numbers, sets, dtypes)."""
    return atomic_write(path, json.dumps(results, indent=2, default=handle_non_serializable) + "\n")
