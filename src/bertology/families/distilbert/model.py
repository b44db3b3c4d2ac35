"""DistilBERT (Sanh et al. 2019): a BERT with half the layers, no segment table, no pooler, no
NSP head, trained by distillation from a BERT teacher (`objectives/distil.py`).

The network is RoBERTa's pretraining model (the shared encoder and a tied MLM head) configured
with `type_vocab_size=0` and `pooler=False`; this family exists for what is DistilBERT's own: its
Hugging Face record (`DistilBertForMaskedLM`) and its start from the teacher's layers.

Student initialisation (`from_teacher`, HF's `scripts/extract_distilbert.py`): the teacher's
embeddings, its MLM head, and the teacher layers `teacher_layers(N, n)`, which for a 12-layer
teacher and a 6-layer student are the reference's [0, 2, 4, 7, 9, 11]. The rule for any depths:
n layers spread evenly over the N, first and last included, index i * (N-1)/(n-1) rounded half
up (a 1-layer student takes layer 0). Where the reference drops the teacher's segment table, we
fold its row 0 into the position table, so the copied embedding layer computes exactly what the
teacher's does on one-segment input (the reference's student starts that row away from it).
"""

from __future__ import annotations

import math

import numpy as np

from bertology.errors import UserError
from bertology.families.roberta.model import Model, flops_per_token, trunk
from bertology.models import Family, layout


def teacher_layers(teacher_depth: int, student_depth: int) -> list[int]:
    """Which teacher layer initialises each student layer (see the module docstring)."""
    if not 1 <= student_depth <= teacher_depth:
        raise UserError(f"a {student_depth}-layer student cannot be taken from a {teacher_depth}-layer teacher; "
                        f"set model.num_layers between 1 and {teacher_depth}")
    if student_depth == 1:
        return [0]
    return [math.floor(i * (teacher_depth - 1) / (student_depth - 1) + 0.5) for i in range(student_depth)]


def from_teacher(teacher: dict, fresh: dict) -> dict:
    """Student parameters (shaped like `fresh`) from a BERT-style teacher's: embeddings (segment
    row 0 folded into the positions), the layers `teacher_layers` names, and the MLM head."""
    encoder = teacher.get("encoder", {})
    layers = {k for k in encoder if layout.layer_of((k,), layout.stack_layer_index) is not None}
    other = set(encoder) - layers - {"embeddings", "pooler"}
    if "mlm" not in teacher or other or "layers" in fresh["encoder"]:
        raise UserError("DistilBERT students start from an unscanned BERT, RoBERTa or DistilBERT teacher with an MLM "
                        f"head (this one has {sorted(other) or 'no mlm head'}); use such a teacher, with "
                        "model.scan_layers=False for both")
    depth = layout.depth(encoder, layout.stack_layer_index)
    student_depth = layout.depth(fresh["encoder"], layout.stack_layer_index)
    embeddings = dict(encoder["embeddings"])
    segment = embeddings.pop("segment", None)
    if segment is not None:
        position = np.asarray(embeddings["position"]["embedding"])
        embeddings["position"] = {"embedding": position + np.asarray(segment["embedding"])[0]}
    params = {"embeddings": embeddings}
    for j, i in enumerate(teacher_layers(depth, student_depth)):
        params[f"attention_{j}"], params[f"ffn_{j}"] = encoder[f"attention_{i}"], encoder[f"ffn_{i}"]
    return {"encoder": params, "mlm": teacher["mlm"]}


# RoBERTa's network; DistilBERT's own is its start from the teacher.
FAMILY = Family(Model, trunk, flops_per_token, from_teacher=from_teacher)
