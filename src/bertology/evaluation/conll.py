"""CoNLL-2003 entity-level scoring, with the chunking rules of the shared task's conlleval.

A chunk is a maximal run of tags of one type. Following conlleval, a chunk starts at B-, at S-,
at an I- or E- that follows O, E- or S-, and whenever the type changes -- so an I- with no B-
before it (plain IOB1, as CoNLL-2003 is tagged) opens an entity. An entity counts as correct only
if its start, end and type all match. Precision, recall and F1 are micro-averaged over entities,
in percent as conlleval prints them. `to_iob2` rewrites any of these schemes as IOB2 through the
same chunks, so a file and its conversion hold the same entities by construction.
"""

from __future__ import annotations

from typing import Iterable

Span = tuple[int, int, str]  # (first token, last token, type)


def _split(tag: str) -> tuple[str, str]:
    if tag in ("O", ""):
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return (prefix, kind) if kind else ("I", prefix)  # a bare type ("PER") is an inside tag


def _starts(prev: str, prev_kind: str, tag: str, kind: str) -> bool:
    if tag in ("B", "S"):
        return True
    if tag in ("I", "E") and prev in ("O", "E", "S"):
        return True
    return tag != "O" and kind != prev_kind


def _ends(prev: str, prev_kind: str, tag: str, kind: str) -> bool:
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev != "O" and kind != prev_kind


def chunks(tags: Iterable[str]) -> list[Span]:
    """Entities of one sentence's tag sequence (IOB1, IOB2 or IOBES), in order."""
    spans: list[Span] = []
    prev, prev_kind, start = "O", "", None
    tags = list(tags)
    for i, raw in enumerate([*tags, "O"]):  # a final O closes the last chunk
        tag, kind = _split(raw)
        if start is not None and _ends(prev, prev_kind, tag, kind):
            spans.append((start, i - 1, prev_kind))
            start = None
        if _starts(prev, prev_kind, tag, kind):
            start = i
        prev, prev_kind = tag, kind
    return spans


def to_iob2(tags: Iterable[str]) -> list[str]:
    """The same entities tagged IOB2: B- on every entity's first token, I- on the rest, O elsewhere."""
    out = ["O"] * len(tags := list(tags))
    for first, last, kind in chunks(tags):
        out[first:last + 1] = [f"B-{kind}"] + [f"I-{kind}"] * (last - first)
    return out


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Micro precision / recall / F1 (percent) over the entities of every sentence."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    n_gold = n_pred = n_correct = 0
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"sentence of {len(g)} gold tags has {len(p)} predicted tags")
        g_spans, p_spans = set(chunks(g)), set(chunks(p))
        n_gold, n_pred, n_correct = n_gold + len(g_spans), n_pred + len(p_spans), n_correct + len(g_spans & p_spans)
    precision = 100.0 * n_correct / n_pred if n_pred else 0.0
    recall = 100.0 * n_correct / n_gold if n_gold else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f, "gold_entities": n_gold, "predicted_entities": n_pred}
