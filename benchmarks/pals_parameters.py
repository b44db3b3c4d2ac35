"""The parameters stored to serve GLUE's eight multi-task tasks with BERT-base, each way of fine-tuning
(Stickland & Murray 2019's comparison): a fine-tuned model per task, Houlsby adapters per task, one
encoder with a head per task (MT-DNN), and that with each task's PALs.

    python -m benchmarks.pals_parameters [--size 204] [--heads 12] [--per_layer] [--adapter_size 64]

Shapes only (`multitask.parameter_counts`, `jax.eval_shape`): no data, no checkpoint, seconds on a
CPU. A multi-task run writes the same table for its own tasks and model (WORKDIR/parameters.md).
"""

from __future__ import annotations

import argparse

import numpy as np

from bertology import models, tasks
from bertology.models.pals import PALSettings
from bertology.models.presets import bert_preset
from bertology.models.tasks import Head
from bertology.tasks import kinds
from bertology.train import finetune, multitask

GLUE = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")  # all but WNLI, as both papers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=204, help="the PALs' width d_s")
    parser.add_argument("--heads", type=int, default=12, help="the PALs' attention heads")
    parser.add_argument("--per_layer", action="store_true", help="a down and up projection per layer, not per task")
    parser.add_argument("--adapter_size", type=int, default=64, help="the Houlsby adapters' bottleneck")
    args = parser.parse_args()
    block = {"family": "bert", "vocab_size": 30522, **bert_preset("base")}
    record = models.family("bert")
    trunk = finetune.Trunk(models.encoder_config(block), "bert", record, None, block, None)
    heads = [Head(name, tasks.get(name).kind, kinds.of(tasks.get(name).kind).width(tasks.get(name))) for name in GLUE]
    row = {"input_ids": np.zeros((1, 128), np.int32), "input_mask": np.ones((1, 128), np.int32),
           "segment_ids": np.zeros((1, 128), np.int32)}
    pals = PALSettings(args.size, args.heads, not args.per_layer)
    print(multitask.parameter_table(multitask.parameter_counts(trunk, heads, {h.name: row for h in heads},
                                                                args.adapter_size, pals)))


if __name__ == "__main__":
    main()
