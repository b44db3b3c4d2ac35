"""Extractive QA windows: character offsets <-> token spans, sliding windows, answer decoding.

Contexts are longer than the model, so (as the reference BERT does) each one is cut into windows
of `max_seq_length` tokens ([CLS] question [SEP] context-slice [SEP]) that start `doc_stride`
tokens apart. Every context token remembers the characters it came from, so a gold answer's
character span becomes a token span in each window that holds it whole (other windows point at
[CLS], "no answer here"), and a predicted token span becomes an exact substring of the context.
A token seen by several windows is only scored in the one where it has the most context on both
sides. SQuAD 2.0 answers "" when the best [CLS] score beats the best span by more than
`null_threshold`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from bertology.data.tokenizers import Tokenizer
from bertology.data.tokenizers.wordpiece import _is_punctuation  # BERT's split points inside a word
from bertology.tasks.encode import BERT_LAYOUT, Layout, pack, stack

Span = tuple[int, int]  # [start, end) in characters


def _units(text: str) -> list[Span]:
    """Whitespace-separated words, with each punctuation character split off on its own."""
    units: list[Span] = []
    start = None
    for i, ch in enumerate([*text, " "]):
        if ch.isspace() or _is_punctuation(ch):
            if start is not None:
                units.append((start, i))
                start = None
            if not ch.isspace():
                units.append((i, i + 1))
        elif start is None:
            start = i
    return units


def tokenize_with_offsets(tokenizer: Tokenizer, text: str) -> tuple[list[int], list[Span]]:
    """Token ids of `text` and the character span of each token.

    Each unit (word or punctuation mark) is tokenized alone. Its pieces get consecutive character
    spans when their lengths (without the `##` or `▁` marker) add up to the unit's; otherwise
    (normalisation changed the length) every piece gets the whole unit's span.
    """
    ids: list[int] = []
    spans: list[Span] = []
    for start, end in _units(text):
        pieces = tokenizer.tokenize(text[start:end])
        if not pieces:
            continue
        lengths = [len(p.removeprefix("##").removeprefix("\u2581")) for p in pieces]
        if sum(lengths) == end - start:
            edges = np.cumsum([start, *lengths])
            spans += [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
        else:
            spans += [(start, end)] * len(pieces)
        ids += tokenizer.convert_tokens_to_ids(pieces)
    return ids, spans


def char_to_token_span(spans: Sequence[Span], start: int, end: int) -> tuple[int, int] | None:
    """First and last token overlapping characters [start, end); None if no token does."""
    hit = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
    return (hit[0], hit[-1]) if hit else None


@dataclasses.dataclass
class Window:
    example: int  # index of the example it came from
    doc_start: int  # first context token in the window
    token_to_doc: np.ndarray  # [max_len] context token index at each position, -1 elsewhere
    max_context: np.ndarray  # [max_len] bool: this window is the best one for that token
    cls_index: int = 0  # the summary token's position: where "no answer" points


def window_starts(num_doc: int, max_doc: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_doc` context tokens, as the reference slides them."""
    out, start = [], 0
    while True:
        length = min(num_doc - start, max_doc)
        out.append((start, length))
        if start + length >= num_doc:
            return out
        start += min(length, stride)


def _max_context(windows: list[tuple[int, int]], w: int, pos: int) -> bool:
    """Whether window w has the largest min(left, right) context (+0.01·length) for token pos."""
    best, best_score = None, None
    for i, (start, length) in enumerate(windows):
        if not start <= pos < start + length:
            continue
        score = min(pos - start, start + length - 1 - pos) + 0.01 * length
        if best_score is None or score > best_score:
            best, best_score = i, score
    return best == w


def encode(
    tokenizer: Tokenizer, examples: list[dict[str, Any]], max_len: int, stride: int, max_query: int,
    layout: Layout = BERT_LAYOUT,
) -> tuple[dict[str, np.ndarray], list[Window], list[list[Span]]]:
    """Model inputs (with start/end positions) for every window, the windows, and each context's
    token character spans. With the summary token last (XLNet) the context comes first and the
    question second, as XLNet's run_squad puts them ("during pretraining, B is always shorter than
    A"); a window without the answer points at the summary token."""
    rows, windows, all_spans = [], [], []
    for e, ex in enumerate(examples):
        query = tokenizer.encode(ex["question"])[:max_query]
        doc, spans = tokenize_with_offsets(tokenizer, ex["context"])
        all_spans.append(spans)
        answer = None
        if ex["answers"] and not ex.get("is_impossible"):
            start = ex["answer_starts"][0]
            answer = char_to_token_span(spans, start, start + len(ex["answers"][0]))
        slides = window_starts(len(doc), max_len - len(query) - 3, stride)
        context_first = layout.cls_position == "last"
        for w, (start, length) in enumerate(slides):
            piece = doc[start:start + length]
            a, b = (piece, query) if context_first else (query, piece)
            row = pack(tokenizer, a, b, max_len, layout)
            a_start, b_start, cls_index = layout.place(len(a), len(b), max_len)
            offset = a_start if context_first else b_start
            token_to_doc = np.full(max_len, -1, np.int32)
            token_to_doc[offset:offset + length] = np.arange(start, start + length)
            max_context = np.zeros(max_len, bool)
            max_context[offset:offset + length] = [_max_context(slides, w, p) for p in range(start, start + length)]
            s = t = cls_index
            if answer and start <= answer[0] and answer[1] < start + length:
                s, t = answer[0] - start + offset, answer[1] - start + offset
            rows.append({**row, "start_position": s, "end_position": t})
            windows.append(Window(e, start, token_to_doc, max_context, cls_index))
    arrays = {k: v.astype(np.int32) for k, v in stack(rows).items()}
    return arrays, windows, all_spans


def decode(
    examples: list[dict[str, Any]],
    windows: list[Window],
    spans: list[list[Span]],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_threshold: float | None = None,
) -> dict[str, str]:
    """{question id: answer text}. `null_threshold` None (SQuAD 1.1) always answers a span."""
    best: dict[int, tuple[float, int, int]] = {}
    null: dict[int, float] = {}
    for w, win in enumerate(windows):
        s_logits, e_logits = start_logits[w], end_logits[w]
        null[win.example] = min(null.get(win.example, np.inf), float(s_logits[win.cls_index] + e_logits[win.cls_index]))
        starts = np.argsort(-s_logits)[:n_best]
        ends = np.argsort(-e_logits)[:n_best]
        for s in starts:
            if win.token_to_doc[s] < 0 or not win.max_context[s]:
                continue
            for t in ends:
                if win.token_to_doc[t] < 0 or t < s or t - s + 1 > max_answer_length:
                    continue
                score = float(s_logits[s] + e_logits[t])
                if win.example not in best or score > best[win.example][0]:
                    best[win.example] = (score, int(win.token_to_doc[s]), int(win.token_to_doc[t]))
    out = {}
    for e, ex in enumerate(examples):
        text = ""
        if e in best:
            score, first, last = best[e]
            text = ex["context"][spans[e][first][0]:spans[e][last][1]]
            if null_threshold is not None and null[e] - score > null_threshold:
                text = ""
        out[ex["id"]] = text
    return out
