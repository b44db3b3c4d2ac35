"""Scores of generated text against references: ROUGE (Lin 2004) through Google's `rouge-score`
package (the reimplementation of ROUGE-1.5.5 that the summarisation papers since T5 report) and
corpus BLEU (Papineni et al. 2002) through `sacrebleu` (Post 2018), so that the figures are
comparable with published ones; nothing here counts n-grams itself.

ROUGE-1/2/L are F-measures averaged over examples, with the Porter stemmer as the papers run it;
`rougeLsum` is the summary-level LCS over newline-separated sentences (CNN/DailyMail's
highlights are one per line). All scores are percentages.
"""

from __future__ import annotations

import numpy as np
import sacrebleu
from rouge_score import rouge_scorer

from bertology.errors import UserError

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def rouge(predictions: list[str], references: list[str], *, use_stemmer: bool = True) -> dict[str, float]:
    """Mean ROUGE-1, -2, -L and -Lsum F1 (percent) of each prediction against its reference."""
    _check(predictions, references)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=use_stemmer)
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    return {k: 100.0 * float(np.mean([s[k].fmeasure for s in scores])) for k in ROUGE_KEYS}


def bleu(predictions: list[str], references: list[str]) -> float:
    """sacrebleu's corpus BLEU (13a tokenisation, one reference per prediction)."""
    _check(predictions, references)
    return float(sacrebleu.corpus_bleu(predictions, [references]).score)


def score(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE-1/2/L/Lsum and BLEU, the figures a seq2seq fine-tuning run reports."""
    return {**rouge(predictions, references), "bleu": bleu(predictions, references)}


def _check(predictions: list[str], references: list[str]) -> None:
    if len(predictions) != len(references) or not references:
        raise UserError(f"{len(predictions)} predictions for {len(references)} references; give one per reference "
                        "and at least one")
