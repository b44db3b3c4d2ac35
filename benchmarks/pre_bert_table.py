"""The pre-BERT baselines against tiny BERT at equal pretraining FLOPs, on the embedded task: the
miniature of BERT's GLUE comparison row "BiLSTM+ELMo+Attn" vs BERT (Devlin et al. 2019, Table 1).

    python -m benchmarks.pre_bert_table --workdir runs/pre_bert --reference-steps 200

Tiny BERT pretrains `reference-steps` steps; tiny ELMo (biLM), the tiny LSTM LM (Dai & Le) and
tiny GPT get the steps that buy the same nominal FLOPs at their own cost per token
(`bertology.sweep.flops_per_token`, the equal-FLOP sweep's count), at the same batch and row
length (WordPieces for BERT, words for the LSTMs, byte-level BPE for GPT). Each is then
fine-tuned on the embedded task with `configs/finetune/embedded.py`: ELMo frozen through its
scalar mix (`mode=features`, as Peters et al. use it) under a linear head and under GLUE's
BiLSTM+Attn task model (`models/task_encoders.py`), the LSTM LM and BERT whole (`mode=full`);
GPT whole as Radford et al. fine-tune it (`configs/finetune/gpt.py`: the causal trunk read at the
last token, plus half its LM loss); plus BERT, GPT and the LSTM from scratch. Prints a Markdown
table; finished runs are kept, so a stopped run continues, and `--rows` runs some of them.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import ml_collections

from bertology.data.tokenizers import for_data
from bertology.sweep import flops_per_token, load_config
from bertology.train.finetune import trainable_mask

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
# (run name, row label, pretraining config or None, fine-tuning mode, from-scratch model config, task encoder,
# fine-tuning config in configs/finetune/)
ROWS = (
    ("lstm_scratch", "LSTM, from scratch", None, "full", "lstm_lm", "none", "embedded.py"),
    ("lstm_lm", "LSTM, LSTM-LM initialisation (Dai & Le)", "lstm_lm", "full", None, "none", "embedded.py"),
    ("elmo", "BiLSTM biLM, ELMo features (frozen, scalar mix + linear head)", "elmo", "features", None, "none",
     "embedded.py"),
    ("elmo_bilstm_attn", "BiLSTM biLM, ELMo features (frozen, scalar mix) + BiLSTM+Attn task model", "elmo",
     "features", None, "bilstm_attn", "embedded.py"),
    ("gpt_scratch", "GPT, from scratch (causal trunk, last token; + 0.5 LM loss)", None, "full", "gpt", "none",
     "gpt.py"),
    ("gpt", "GPT, pretrained (causal LM; fine-tuned as Radford et al.: last token, + 0.5 LM loss)", "gpt", "full",
     None, "none", "gpt.py"),
    ("bert_scratch", "BERT, from scratch", None, "full", "bert", "none", "embedded.py"),
    ("bert", "BERT, pretrained (MLM + NSP)", "bert", "full", None, "none", "embedded.py"),
)


def pretrain_config(name: str, steps: int, batch_size: int, length: int) -> ml_collections.ConfigDict:
    """`configs/<name>.py:tiny` at this batch and row length for `steps` steps (10% warmup); BERT
    keeps its masked fraction of the row."""
    c = load_config(CONFIGS / f"{name}.py", "tiny")
    if "max_predictions_per_seq" in c.data:
        ratio = c.data.max_predictions_per_seq / c.data.max_seq_length
        c.data.max_predictions_per_seq = max(1, int(round(ratio * length)))
    c.data.max_seq_length = length
    c.batch_size, c.total_steps = batch_size, steps
    c.optimizer.warmup_steps = max(1, steps // 10)
    c.eval_every, c.checkpoint_every, c.log_every = 0, steps, max(1, steps // 5)
    return c


def flops_per_step(name: str, batch_size: int, length: int) -> float:
    """Nominal training FLOPs of one pretraining step of `name`."""
    c = pretrain_config(name, 1, batch_size, length)
    return flops_per_token(c, for_data(c.data).vocab_size) * batch_size * length


def finetune_config(init: str | None, mode: str, scratch: str | None, epochs: int, length: int,
                    task_encoder: str = "none", file: str = "embedded.py") -> ml_collections.ConfigDict:
    """`configs/finetune/<file>` on the embedded task from `init`, or from scratch with the `model`
    block (and vocabulary) of `configs/<scratch>.py:tiny` (or the file's own model, as GPT's file
    has); a task encoder at its default (small) size."""
    c = load_config(CONFIGS / "finetune" / file)
    c.update(init_checkpoint=init, mode=mode, epochs=epochs)
    c.task_encoder.name = task_encoder
    c.data.max_seq_length = length
    if scratch:
        pre = load_config(CONFIGS / f"{scratch}.py", "tiny")
        c.model = pre.model
        c.data.vocab = pre.data.get("vocab")
    return c


def run(workdir: pathlib.Path, reference_steps: int, batch_size: int, length: int, epochs: int,
        finetune_length: int, names: tuple[str, ...] = tuple(r[0] for r in ROWS)) -> list[dict]:
    from bertology.train.finetune import finetune
    from bertology.train.loop import train

    budget = reference_steps * flops_per_step("bert", batch_size, length)
    rows = []
    for name, label, pre, mode, scratch, task_encoder, file in ROWS:
        if name not in names:
            continue
        record = workdir / f"{name}.json"
        if record.is_file():
            rows.append(json.loads(record.read_text()))
            continue
        steps, init = 0, None
        if pre:
            steps = max(1, int(round(budget / flops_per_step(pre, batch_size, length))))
            init = workdir / "pretrain" / pre
            if not (init / "checkpoints").is_dir() or not any((init / "checkpoints").iterdir()):
                train(pretrain_config(pre, steps, batch_size, length), init)
        result = finetune(finetune_config(init and str(init), mode, scratch, epochs, finetune_length, task_encoder,
                                          file), workdir / "finetune" / name)
        params = result["params"]
        trained = sum(x.size for x, t in zip(jax.tree.leaves(params), jax.tree.leaves(trainable_mask(params, mode))) if t)
        row = {"label": label, "mode": mode, "steps": steps,
               "flops": steps * flops_per_step(pre, batch_size, length) if pre else 0.0,
               "parameters": int(sum(x.size for x in jax.tree.leaves(params))), "trained": int(trained),
               "accuracy": result["scores"]["accuracy"], "finetune_steps": result["steps"]}
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(row, indent=2))
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model and initialisation | fine-tuning | pretraining steps | pretraining FLOPs | parameters (trained) "
             "| embedded-task accuracy |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['mode']}, {r['finetune_steps']} steps | {r['steps'] or '—'} | "
              f"{r['flops']:.2e} | {r['parameters'] / 1e6:.2f}M ({r['trained'] / 1e6:.3f}M) | {r['accuracy']:.2f} |"
              for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="runs/pre_bert")
    p.add_argument("--reference-steps", type=int, default=200, help="tiny BERT's pretraining steps: the budget")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--length", type=int, default=32, help="pretraining row length (WordPieces or words)")
    p.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs over the embedded task")
    p.add_argument("--finetune-length", type=int, default=64)
    p.add_argument("--rows", default=",".join(r[0] for r in ROWS), help="which rows to run, by run name")
    a = p.parse_args()
    rows = run(pathlib.Path(a.workdir), a.reference_steps, a.batch_size, a.length, a.epochs, a.finetune_length,
               tuple(a.rows.split(",")))
    print(table(rows))


if __name__ == "__main__":
    main()
