"""SQuAD v1.1 and v2.0 scoring, following the official evaluation scripts' rules.

Answers are normalised before comparison: lower-cased, every ASCII punctuation character removed,
the articles a/an/the (as whole words) removed, white space collapsed. EM and F1 take the maximum
over the gold answers. v2.0 adds unanswerable questions: gold answers that normalise to nothing
are dropped, a question left with none has the single gold answer "", and F1 between token
lists of which one is empty is 1 if both are empty, else 0. Scores are percentages, as reported.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, *, version: str = "v1.1") -> float:
    """Token-overlap F1 after normalisation; v2.0 scores an empty side 1 only if both are empty."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == "v2.0" and (not pred or not ref):
        return float(pred == ref)
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def gold_answers(answers: list[str], version: str) -> list[str]:
    if version == "v2.0":
        return [a for a in answers if normalize_answer(a)] or [""]
    return answers


def evaluate(gold: dict[str, list[str]], predictions: dict[str, str], version: str) -> dict[str, Any]:
    """{'exact', 'f1', 'total'} over every question in `gold` (id -> answer texts, [] when
    unanswerable); a question without a prediction scores 0. v2.0 adds HasAns_* / NoAns_* parts."""
    if version not in ("v1.1", "v2.0"):
        raise ValueError(f"unknown SQuAD version {version!r}; use v1.1 or v2.0")
    em, f = {}, {}
    for qid, answers in gold.items():
        refs = gold_answers(answers, version)
        pred = predictions.get(qid)
        if pred is None:
            em[qid] = f[qid] = 0.0
            continue
        em[qid] = max(exact_match(pred, r) for r in refs)
        f[qid] = max(f1(pred, r, version=version) for r in refs)
    out = _totals(em, f, list(gold))
    if version == "v2.0":
        # As the official script: a question "has an answer" when its answer list is non-empty.
        for name, ids in (("HasAns", [q for q in gold if gold[q]]), ("NoAns", [q for q in gold if not gold[q]])):
            if ids:
                out.update({f"{name}_{k}": v for k, v in _totals(em, f, ids).items()})
    return out


def _totals(em: dict[str, float], f: dict[str, float], ids: list[str]) -> dict[str, float]:
    n = len(ids)
    return {
        "exact": 100.0 * sum(em[q] for q in ids) / n if n else 0.0,
        "f1": 100.0 * sum(f[q] for q in ids) / n if n else 0.0,
        "total": n,
    }
