"""What an export writes beside the weights for the Hugging Face tools that read a model directory:
a model card (`README.md`, the page the Hub shows) and, for a model that generates, a
`generation_config.json`.

The card is read from the run itself (its config.json, the exported step and metrics.jsonl), so the
numbers a reader sees are the run's: the model block, what it trained on, for how many steps, and
its last training and evaluation metrics at the exported step.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from bertology.train.metrics import read_steps

# the model block's keys a card lists first (the network's size); the rest follow in a table
HEADLINE = ("family", "hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size")
# HF config keys a generation_config.json takes from the model's config.json
GENERATION_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _metrics(workdir: pathlib.Path, step: int) -> tuple[tuple[int, dict] | None, tuple[int, dict] | None]:
    """(step, training metrics) of the last logged step at or before `step`, and the same for the
    last evaluation (`eval_*`); None where the run logged none (an imported checkpoint)."""
    path = workdir / "metrics.jsonl"
    rows = [(s, {k: v for k, v in r.items() if k != "time"}) for s, r in read_steps(path).items()
            if s <= step] if path.exists() else []
    train = [(s, {k: v for k, v in r.items() if not k.startswith("eval_")}) for s, r in rows]
    evals = [(s, {k: v for k, v in r.items() if k.startswith("eval_")}) for s, r in rows]
    return (next((x for x in reversed(train) if x[1]), None), next((x for x in reversed(evals) if x[1]), None))


def _table(values: dict[str, Any]) -> list[str]:
    return ["| key | value |", "|---|---|", *(f"| `{k}` | {json.dumps(v)} |" for k, v in values.items())]


def model_card(workdir: pathlib.Path, run_config: dict[str, Any], step: int, model_type: str,
               architecture: str) -> str:
    """The README.md of an export of `workdir` at `step` as HF `model_type` / `architecture`."""
    block, data = run_config["model"], run_config.get("data") or {}
    mixture = ", ".join(f"{path} (weight {weight:g})" for path, weight in data.get("corpora") or ())  # loop.resolved's pairs
    trained_on = (data.get("corpus") or mixture or data.get("task")
                  or ("the embedded corpus" if "objective" in run_config else None))
    lines = ["---", "library_name: transformers", f"tags: [bertology, {model_type}]", "---", "",
             f"# {workdir.name}", "",
             f"Exported by bertology from the run `{workdir.name}` at step {step}, as transformers' "
             f"`{architecture}` (`model_type: {model_type}`).", "", "## Model", "",
             *_table({k: block[k] for k in HEADLINE if k in block}), "",
             "<details><summary>The whole model block</summary>", "",
             *_table({k: v for k, v in block.items() if k not in HEADLINE}), "", "</details>", "", "## Training", ""]
    if run_config.get("imported_from"):
        lines.append(f"Imported from {', '.join(run_config['imported_from'].values())}.")
    if trained_on:
        lines.append(f"Trained on {trained_on}" + (f" for {run_config['total_steps']} steps"
                                                   if "total_steps" in run_config else "") +
                     (f" of {run_config['batch_size']} rows" if "batch_size" in run_config else "") +
                     (f" of {data['max_seq_length']} tokens" if "max_seq_length" in data else "") + ".")
    train, evaluation = _metrics(workdir, step)
    for title, found in (("Last training metrics", train), ("Last evaluation", evaluation)):
        if found:
            lines += ["", f"### {title} (step {found[0]})", "", *_table(found[1])]
    if not (train or evaluation):
        lines.append("The run logged no metrics.")
    return "\n".join(lines) + "\n"


def generation_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The generation_config.json of a model with `hf_config`: its special token ids (what
    transformers' `GenerationConfig.from_model_config` takes from config.json)."""
    return {k: hf_config[k] for k in GENERATION_KEYS if hf_config.get(k) is not None}
