"""ERNIE's (Tsinghua) pretraining rows: `data.objective="ernie_kg"` (`KnowledgeRows`), registered with
the shared registry (`bertology.data.transforms`), which finds it by importing this module.

BERT's segment pairs and masking (NSP labels, MLM slots), plus the entities: each row's mentions of
the knowledge graph `data.kg` (`knowledge.py`) are aligned to their first tokens when the instances
are made, and every corruption adds the denoising entity auto-encoder's inputs and targets
(`entity_inputs`).
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any, Sequence

import ml_collections
import numpy as np

from bertology import validation
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document, MaskedLM, register
from bertology.errors import UserError
from bertology.families.ernie_kg import knowledge


def entity_inputs(entity_ids: np.ndarray, vectors: np.ndarray, rng: np.random.Generator, *, max_entities: int,
                  replace_prob: float = 0.05, mask_prob: float = 0.15) -> Batch:
    """The dEA's arrays for rows of aligned entity ids ([rows, length], -1: none).

    Targets, as thunlp/ERNIE's `run_pretrain.py`: every aligned token predicts its own entity among
    its row's candidates, `entity_labels` (an index into them, `entity_weights` 1.0). The candidates
    are slot 0, the zero vector (the reference's candidates include the null entity's zero row),
    then the row's distinct entities in id order, at most `max_entities` (the alignments of any
    further ones are dropped). The reference's candidates are the whole batch's distinct entities;
    per-row candidates keep every array row-shaped, so that microbatches, sharding and the
    evaluation split (corrupted as one block) all score a row against the same set.

    Inputs, denoised: of the aligned tokens, `replace_prob` get a random entity of the graph
    (the reference draws from the batch's), `mask_prob` none (the entity is masked), the rest their
    own. `entity_vectors` [rows, length, d] holds the (corrupted) entities' vectors, zero where
    none; `entity_mask` [rows, length] where one is present."""
    rows, length = entity_ids.shape
    ids = entity_ids.copy()
    candidates = np.full((rows, max_entities + 1), -1, np.int64)
    labels = np.zeros((rows, length), np.int32)
    for r in range(rows):
        distinct = np.unique(ids[r][ids[r] >= 0])
        ids[r][~np.isin(ids[r], distinct[:max_entities])] = -1
        kept = distinct[:max_entities]
        candidates[r, 1:1 + len(kept)] = kept
        labels[r] = np.where(ids[r] >= 0, np.searchsorted(kept, ids[r]) + 1, 0)
    aligned = ids >= 0
    draw = rng.random(ids.shape)
    corrupted = np.where(draw < replace_prob, rng.integers(0, len(vectors), ids.shape), ids)
    corrupted = np.where((draw >= replace_prob) & (draw < replace_prob + mask_prob), -1, corrupted)
    corrupted = np.where(aligned, corrupted, -1)
    return {
        "entity_vectors": knowledge.lookup(corrupted, vectors),
        "entity_mask": (corrupted >= 0).astype(np.int32),
        "entity_candidates": knowledge.lookup(candidates, vectors),
        "entity_candidate_mask": np.concatenate([np.ones((rows, 1), np.int32), (candidates[:, 1:] >= 0)], axis=1,
                                                dtype=np.int32),
        "entity_labels": labels,
        "entity_weights": aligned.astype(np.float32),
    }


def _graph(kg: Any) -> Any:
    """A `kg` key's graph: "embedded" where unset (None or absent), as `knowledge.graph_directory` reads it."""
    return "embedded" if kg in (None, validation.MISSING) else kg


@register("ernie_kg")
class KnowledgeRows(MaskedLM):
    """BERT's pairs and masking with aligned entities (`entity_ids`) and the dEA's inputs (module docstring).

    Keys: data.kg (a directory of `knowledge.py`'s files, or "embedded": the standard library's
    graph), data.max_entities (distinct entities a row keeps), data.entity_replace_prob (0.05) and
    data.entity_mask_prob (0.15)."""

    @classmethod
    def validate(cls, config: ml_collections.ConfigDict) -> None:
        """BERT's rules, then: pairs (the NSP head needs them), probabilities that fit in [0, 1], at
        least one entity a row, `model.kg` naming the graph `data.kg` reads (the run's config.json
        keeps only the model block for fine-tuning, whose rows align to that graph:
        `model.task_inputs`; the presets tie the two keys), and entity vectors as wide as
        `model.entity_size`."""
        super().validate(config)
        instances = validation.get(config, "data.instances")
        if instances not in ("pairs", validation.MISSING):
            raise validation.refuse("data.instances", instances, "gives no NSP pairs, which ERNIE's objective reads",
                                    "set --config.data.instances=pairs")
        replace, mask = (validation.get(config, f"data.entity_{k}_prob") for k in ("replace", "mask"))
        if validation.MISSING not in (replace, mask) and not (0 <= replace and 0 <= mask and replace + mask <= 1):
            raise validation.refuse("data.entity_replace_prob", replace, f"and data.entity_mask_prob={mask!r} are not "
                                    "probabilities summing to at most 1", "use the paper's 0.05 and 0.15")
        most = validation.get(config, "data.max_entities")
        if most is not validation.MISSING and not (isinstance(most, int) and most >= 1):
            raise validation.refuse("data.max_entities", most, "must be a positive count", "use e.g. 16")
        kg, recorded = (_graph(validation.get(config, f"{block}.kg")) for block in ("data", "model"))
        if kg != recorded:
            raise validation.refuse("model.kg", recorded, f"is not data.kg={kg!r}, the graph pretraining aligns "
                                    "(fine-tuning aligns task text with model.kg)", f"set --config.model.kg={kg}")
        size = validation.get(config, "model.entity_size")
        if size is validation.MISSING:
            return
        if kg == "embedded":
            width = knowledge.ENTITY_DIM
        elif (pathlib.Path(kg) / knowledge.FILES[1]).is_file():
            width = knowledge.vector_width(kg)
        else:
            raise validation.refuse("data.kg", kg, f"holds no {knowledge.FILES[1]}",
                                    f"give a directory with {', '.join(knowledge.FILES)} or 'embedded'")
        if size not in (None, width):
            raise validation.refuse("model.entity_size", size, f"differs from data.kg's {width}-wide entity vectors",
                                    f"set --config.model.entity_size={width}")

    def __init__(self, cfg: ml_collections.ConfigDict, tokenizer: Tokenizer):
        super().__init__(cfg, tokenizer)
        if self.kind != "pairs":
            raise UserError(f"data.objective='ernie_kg' makes segment pairs, not {self.kind!r}; set data.instances='pairs'")

    @functools.cached_property
    def graph(self) -> knowledge.Graph:
        return knowledge.read_graph(knowledge.graph_directory(self.cfg.get("kg")))

    @functools.cached_property
    def matcher(self) -> knowledge.MentionMatcher:
        return knowledge.MentionMatcher(self.graph.mentions, self.tokenizer)

    def instances(self, documents: Sequence[Document], rng: np.random.Generator) -> Batch:
        batch = super().instances(documents, rng)
        ids = batch["input_ids"]
        aligned = [self.matcher.align(row) for row in ids]
        return {**batch, "entity_ids": np.stack(aligned) if aligned else np.full(ids.shape, -1, np.int32)}

    def corrupt(self, batch: Batch, rng: np.random.Generator) -> Batch:
        cfg = self.cfg
        return {**super().corrupt(batch, rng),
                **entity_inputs(batch["entity_ids"], self.graph.vectors, rng, max_entities=cfg.get("max_entities", 16),
                                replace_prob=cfg.get("entity_replace_prob", 0.05),
                                mask_prob=cfg.get("entity_mask_prob", 0.15))}
