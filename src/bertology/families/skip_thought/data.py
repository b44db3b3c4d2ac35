"""Skip-Thought's rows: `data.objective="skip_thought"`, registered with the shared registry
(`bertology.data.transforms`), which finds it by importing this module.

Every sentence of a document that has a sentence before and after it gives one row: the sentence
as `[CLS] sentence [SEP]` (`input_ids`), and the two neighbours as the decoders' targets
`neighbour [SEP]` (`previous_ids`, `next_ids`) with their teacher-forced inputs `[CLS] neighbour`
(`previous_inputs`, `next_inputs`), each cut to `data.max_seq_length` and padded.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertology.data.transforms import Batch, Document, Transform, register


@register("skip_thought")
class NeighbourRows(Transform):
    """(sentence, previous, next) rows; deterministic: `rng` is unused."""

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        length, tok = self.cfg.max_seq_length, self.tokenizer
        triples = [(doc[k - 1], doc[k], doc[k + 1]) for doc in ([s for s in d if len(s)] for d in documents)
                   for k in range(1, len(doc) - 1)]
        out = {name: np.full((len(triples), length), tok.pad_id, np.int32)
               for name in ("input_ids", "previous_ids", "next_ids")}
        for r, (before, sentence, after) in enumerate(triples):
            rows = {"input_ids": [tok.cls_id, *sentence[: length - 2], tok.sep_id],
                    "previous_ids": [*before[: length - 1], tok.sep_id], "next_ids": [*after[: length - 1], tok.sep_id]}
            for name, ids in rows.items():
                out[name][r, : len(ids)] = ids
        out["input_mask"] = (out["input_ids"] != tok.pad_id).astype(np.int32)
        for side in ("previous", "next"):
            out[f"{side}_mask"] = (out[f"{side}_ids"] != tok.pad_id).astype(np.int32)
            out[f"{side}_inputs"] = np.where(out[f"{side}_mask"] > 0, np.pad(
                out[f"{side}_ids"][:, :-1], ((0, 0), (1, 0)), constant_values=tok.cls_id), tok.pad_id).astype(np.int32)
        return out
