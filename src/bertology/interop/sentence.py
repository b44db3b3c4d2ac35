"""A run as a sentence-transformers model, so MTEB and every sentence-transformers tool can use it.

    python -m bertology.convert --to sentence-transformers --in WORKDIR --out DIR [--step N]

The directory is the run's Hugging Face export (`export_hf`: weights, config.json, tokenizer files,
model card) plus the three files sentence-transformers reads to stack its modules: `modules.json`
(a Transformer, then a Pooling), `sentence_bert_config.json` (the longest input) and
`1_Pooling/config.json`. The pooling is the sentence vector `bertology.features` gives: the mean
over the real tokens ([CLS] and [SEP] included), or for a causal trunk (GPT's) its last real token,
the only one that has read the whole sentence. ELECTRA's directory is its discriminator's.
"""

from __future__ import annotations

import json
import pathlib

from bertology import models
from bertology.files import atomic_write
from bertology.interop.hf import export_hf
from bertology.models import tasks
from bertology.train.checkpoint import read_json

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]
POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                 "lasttoken")


def export_sentence_transformers(workdir: str | pathlib.Path, out_dir: str | pathlib.Path,
                                 step: int | None = None) -> pathlib.Path:
    """Write the run in `workdir` as a sentence-transformers directory under `out_dir`; returns it."""
    workdir = pathlib.Path(workdir)
    run_config = read_json(workdir / "config.json", "pass the --workdir of a bertology run")
    block = run_config["model"]
    trunk = tasks.trunk(models.encoder_config(block), block["family"])
    pooling = "lasttoken" if getattr(trunk, "causal", False) else "mean_tokens"  # a causal stack's `Stack.causal`
    target = export_hf(workdir, out_dir, step)[0]
    longest = min((run_config.get("data") or {}).get("max_seq_length") or 512, block.get("max_position_embeddings") or 512)
    (target / "1_Pooling").mkdir(exist_ok=True)
    atomic_write(target / "1_Pooling" / "config.json", json.dumps(
        {"word_embedding_dimension": block["hidden_size"],
         **{f"pooling_mode_{mode}": mode == pooling for mode in POOLING_MODES}, "include_prompt": True}, indent=2))
    atomic_write(target / "sentence_bert_config.json", json.dumps({"max_seq_length": longest, "do_lower_case": False}))
    atomic_write(target / "modules.json", json.dumps(MODULES, indent=2))  # last: what the loader reads first
    return target
