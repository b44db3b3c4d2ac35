"""The long-range task: a document's class is named once, far into it (no download needed).

Why: the embedded task's sentences fit in 64 tokens, so it cannot tell a long-document encoder
from a 512-token one. Here each example is a synthetic document of about `long_range_tokens`
tokens (4,096) of docstring sentences from the embedded corpus (`bertology.data.embedded`), with
one key sentence, "The answer is <word>.", naming one of `long_range_classes` (K, 4) class words;
the label is that word. The key sentence starts after at least `long_range_prefix` (512) words of
filler, and every word is at least one token under any of our tokenizers, so a model that
truncates the row to its first 512 tokens never sees it and is at chance (1/K), while a model that
reads the whole document (Longformer's global [CLS], Beltagy et al. 2020 §6; ModernBERT's global
layers) can find it: a test of reach, in the spirit of the Long Range Arena (Tay et al. 2021) and
of the needle-in-a-haystack probes, not of language understanding.

No filler sentence contains a class word, so the key sentence is the only evidence. The key
starts at a word drawn uniformly between the prefix and the last word that still falls inside
`long_range_tokens` tokens at a generous `TOKENS_PER_WORD` (docstring text is ~1.35 tokens per
word under the shipped 8k WordPiece and BPE vocabularies). Labels cycle through the K classes, so
every split is balanced; everything is drawn from `long_range_seed` and the split, so a document
is the same in every run. The head has one output per entry of `CLASS_WORDS`; only the first K
occur.
"""

from __future__ import annotations

import functools

import numpy as np

from bertology.data import embedded as corpus
from bertology.errors import UserError
from bertology.evaluation import classification as metrics
from bertology.tasks import Example, Task, builder

CLASS_WORDS = ("violet", "copper", "falcon", "meadow", "harbor", "lantern", "walnut", "glacier")
KEY = "The answer is {}."
TOKENS_PER_WORD = 1.6  # a bound on the tokens per word of docstring prose, for where the key may go
SPLITS = {"train": 0, "validation": 1, "test": 2}
DEFAULTS = dict(long_range_tokens=4096, long_range_classes=4, long_range_prefix=512, long_range_train=1000,
                long_range_eval=200, long_range_seed=0)


@functools.lru_cache(maxsize=1)
def filler_sentences() -> tuple[tuple[str, ...], np.ndarray]:
    """(the corpus sentences that name no class word, their word counts)."""
    text = corpus.embedded_corpus_path().read_text(encoding="utf-8")
    keep = tuple(s for s in text.split("\n") if s.strip() and not any(c in s.lower() for c in CLASS_WORDS))
    return keep, np.array([len(s.split()) for s in keep])


def document(rng: np.random.Generator, label: int, tokens: int, prefix: int) -> tuple[str, int]:
    """(text, the word index where the key sentence starts) of one document of class `label`."""
    sentences, lengths = filler_sentences()
    total_words = int(tokens / 1.35)  # about `tokens` tokens in all (the tail may be cut by the row)
    last_start = int((tokens - 2) / TOKENS_PER_WORD) - len(KEY.split())
    if last_start <= prefix:
        raise UserError(f"data.long_range_tokens={tokens} leaves no room after data.long_range_prefix={prefix} words; "
                        f"use long_range_tokens > {int((prefix + len(KEY.split())) * TOKENS_PER_WORD) + 2}")
    at = int(rng.integers(prefix, last_start + 1))
    before: list[str] = []
    after: list[str] = []
    words = 0
    while words < total_words:
        i = int(rng.integers(len(sentences)))
        (before if words < at else after).append(sentences[i])
        words += int(lengths[i])
    # the key goes at the first sentence boundary at or after `at` words; if that passes the last allowed
    # start, before the sentence that crossed it (still after `prefix` words: sentences are short)
    start = int(np.sum([len(s.split()) for s in before], dtype=int))
    if start > last_start:
        after.insert(0, before.pop())
        start -= len(after[0].split())
        if start < prefix:
            return document(rng, label, tokens, prefix)  # a very long sentence straddles the range: draw again
    return " ".join([*before, KEY.format(CLASS_WORDS[label]), *after]), start


def examples(split: str, n: int, tokens: int, classes: int, prefix: int, seed: int) -> list[Example]:
    """`n` balanced examples of `split` (labels cycle through the classes, then are shuffled)."""
    rng = np.random.default_rng([seed, SPLITS[split]])
    labels = rng.permutation(np.arange(n) % classes)
    rows = []
    for idx, label in enumerate(labels):
        text, start = document(rng, int(label), tokens, prefix)
        rows.append({"idx": idx, "text_a": text, "text_b": "", "label": int(label), "key_word": start})
    return rows


def _load(directory: str | None = None, cache_dir=None, log=print, **options) -> builder.Splits:
    """The splits for the run's `data.long_range_*` settings (generated, not cached: a few seconds)."""
    del directory, cache_dir  # made from the embedded corpus
    o = {**DEFAULTS, **options}
    if not 2 <= o["long_range_classes"] <= len(CLASS_WORDS):
        raise UserError(f"data.long_range_classes={o['long_range_classes']}: between 2 and {len(CLASS_WORDS)}")
    splits, reads = {}, {}
    for split in SPLITS:
        n = o["long_range_train"] if split == "train" else o["long_range_eval"]
        splits[split] = examples(split, n, o["long_range_tokens"], o["long_range_classes"], o["long_range_prefix"],
                                 o["long_range_seed"])
        reads[split] = builder.Read(source=str(corpus.embedded_corpus_path()), kept=n)
    log(f"long_range: {o['long_range_train']} training documents of ~{o['long_range_tokens']} tokens, "
        f"{o['long_range_classes']} classes, key after {o['long_range_prefix']} words")
    return builder.Splits(splits, reads)


def _score(examples: list[Example], predictions: np.ndarray) -> dict[str, float]:
    return {"accuracy": 100 * metrics.accuracy(predictions, np.array([e["label"] for e in examples]))}


TASKS = {
    "long_range": Task(name="long_range", kind="classification", labels=CLASS_WORDS, primary="accuracy",
                       load=_load, score=_score, options=tuple(DEFAULTS)),
}
