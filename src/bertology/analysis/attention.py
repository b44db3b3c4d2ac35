"""Where each head looks: Clark et al. (2019), "What Does BERT Look At?".

Every head's attention maps over the sentences (`bertology.features.attention_maps`), summarised
per layer and head as the mean over all real query tokens of
- the attention to the `[CLS]`-like and `[SEP]`-like tokens (the tokenizer's own) and to
  punctuation (tokens that are punctuation only), which Clark et al. find takes most of many
  heads' attention (a "no-op" when the head's pattern does not apply);
- the attention to the previous and the next token (the positional heads);
- the entropy of the attention distribution, in nats (broad heads near log of the length,
  sharp heads near 0).
"""

from __future__ import annotations

import pathlib
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertology.analysis.plots import pyplot, save
from bertology.errors import UserError

STATISTICS = ("cls", "sep", "punctuation", "previous", "next", "entropy")


class HeadStatistics:
    """Clark et al.'s per-head summaries, accumulated over batches of attention maps: each
    statistic's sum over the real query tokens and their count, per layer and head."""

    def __init__(self, cls_id: int, sep_id: int, punctuation: Any) -> None:
        """`punctuation(ids)`: a boolean array, True where a token id is punctuation."""
        self.cls_id, self.sep_id, self.punctuation = cls_id, sep_id, punctuation
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, float] = dict.fromkeys(STATISTICS, 0.0)

    def add(self, attention: np.ndarray, input_ids: np.ndarray, input_mask: np.ndarray) -> None:
        """One batch: `attention` [b, layers, heads, L, L] with zero rows at padding queries."""
        p = attention.astype(np.float32)  # per-batch sums in float32 (BERT-base's maps: 75 MB a sentence)
        real = input_mask > 0  # [b, L]
        keys = {"cls": input_ids == self.cls_id, "sep": input_ids == self.sep_id,
                "punctuation": self.punctuation(input_ids)}
        for name, key in keys.items():  # the attention each real query gives those keys
            self._add(name, np.einsum("blhqk,bk->lh", p, (key & real).astype(np.float32)), real.sum())
        prev = (real[:, 1:] & real[:, :-1]).astype(np.float32)  # queries 1.. whose previous token is real
        self._add("previous", np.einsum("blhq,bq->lh", np.diagonal(p, -1, 3, 4), prev), prev.sum())
        self._add("next", np.einsum("blhq,bq->lh", np.diagonal(p, 1, 3, 4), prev), prev.sum())
        entropy = -np.sum(p * np.log(np.where(p > 0, p, 1.0)), -1)  # [b, layers, heads, L]; 0 log 0 = 0
        self._add("entropy", np.einsum("blhq,bq->lh", entropy, real.astype(np.float32)), real.sum())

    def _add(self, name: str, total: np.ndarray, count: int) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + total.astype(np.float64)  # across batches in float64
        self.counts[name] += count

    def result(self) -> dict[str, list[list[float]]]:
        """Each statistic as [layer][head] means."""
        return {name: (self.sums[name] / max(self.counts[name], 1)).tolist() for name in STATISTICS}


def head_summary(checkpoint: str | pathlib.Path, texts: Sequence[str], *, max_seq_length: int = 128,
                 show: int = 1) -> dict[str, Any]:
    """{'sentences', 'layers', 'heads', 'statistics': {name: [layer][head]}, 'shown': {'sentence',
    'tokens', 'attention' [layers, heads, n, n] over its n real tokens}} (see the module docstring)."""
    from bertology.data.tokenizers import for_data
    from bertology.features import attention_maps
    from bertology.train.checkpoint import read_json

    if not 1 <= show <= len(texts):
        raise UserError(f"--show={show} but there are {len(texts)} sentences; pick one of 1..{len(texts)}")
    config = read_json(pathlib.Path(checkpoint) / "config.json", "pass the --workdir of a bertology run")
    tokenizer = for_data(config["data"])
    pieces: dict[int, bool] = {}

    def punctuation(ids: np.ndarray) -> np.ndarray:
        for i in np.unique(ids).tolist():
            if i not in pieces:
                text = tokenizer.decode([i]).strip()
                pieces[i] = bool(text) and all(unicodedata.category(c).startswith("P") for c in text)
        return np.vectorize(pieces.__getitem__, otypes=[bool])(ids)

    stats, seen = HeadStatistics(tokenizer.cls_id, tokenizer.sep_id, punctuation), 0
    shown: dict[str, Any] = {}
    for batch in attention_maps(checkpoint, texts, max_seq_length=max_seq_length, batch_size=8):
        stats.add(batch["attention"], batch["input_ids"], batch["input_mask"])
        if seen < show <= seen + len(batch["attention"]):
            row = show - seen - 1
            n = int(batch["input_mask"][row].sum())
            shown = {"sentence": show, "tokens": tokenizer.convert_ids_to_tokens(batch["input_ids"][row, :n].tolist()),
                     "attention": batch["attention"][row, :, :, :n, :n]}
        seen += len(batch["attention"])
    layers, heads = shown["attention"].shape[:2]
    return {"sentences": len(texts), "layers": layers, "heads": heads, "statistics": stats.result(), "shown": shown}


def plot_heads(result: dict[str, Any], path: pathlib.Path) -> None:
    """One layer x head grid per statistic."""
    plt = pyplot()
    names = {"cls": "attention to [CLS]", "sep": "attention to [SEP]", "punctuation": "attention to punctuation",
             "previous": "attention to the previous token", "next": "attention to the next token",
             "entropy": "entropy (nats)"}
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, name in zip(axes.flat, STATISTICS):
        values = np.array(result["statistics"][name])
        image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=0, vmax=None if name == "entropy" else 1)
        ax.set_title(names[name], fontsize="medium")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(values.shape[1]), [str(i + 1) for i in range(values.shape[1])])
        ax.set_yticks(range(values.shape[0]), [str(i + 1) for i in range(values.shape[0])])
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"mean over the real tokens of {result['sentences']} sentences")
    save(fig, path)


def plot_maps(result: dict[str, Any], path: pathlib.Path) -> None:
    """Every head's map of the shown sentence: rows are queries, columns keys."""
    plt = pyplot()
    shown = result["shown"]
    layers, heads, n = shown["attention"].shape[:3]
    size = 1.2 + 0.12 * n
    fig, axes = plt.subplots(layers, heads, figsize=(heads * size, layers * size), squeeze=False)
    ticks, labels = (range(n), shown["tokens"]) if n <= 32 else ([], [])  # beyond 32 tokens labels overlap
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            ax.imshow(shown["attention"][layer, head], cmap="Blues", vmin=0, vmax=1)
            ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize="small")
            ax.set_xticks(ticks, labels, rotation=90, fontsize="xx-small")
            ax.set_yticks(ticks, labels, fontsize="xx-small")
    fig.suptitle(f"sentence {shown['sentence']}: queries (rows) attending to keys (columns)")
    save(fig, path)
