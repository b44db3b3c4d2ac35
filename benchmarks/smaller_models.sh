#!/usr/bin/env bash
# Issue 15's comparison on the embedded classification task: a tiny BERT teacher, a DistilBERT and a
# TinyBERT student distilled from it, Q8BERT (int8 QAT) and magnitude pruning at 50% / 90%, each
# fine-tuned the same 100 steps. Then `python -m benchmarks.smaller_models_table OUT` prints the table.
#   bash benchmarks/smaller_models.sh [OUT=runs/smaller_models]
set -euo pipefail
R=${1:-runs/smaller_models}
PY=${PY:-.venv/bin/python}
PRE="--config.total_steps=150 --config.batch_size=16 --config.data.max_seq_length=64 --config.eval_every=0 --config.mesh.shape=(1,1)"
FT="--config.total_steps=100 --config.mesh.shape=(1,1)"
$PY -m bertology.pretrain --config configs/bert.py:tiny --workdir $R/teacher $PRE
$PY -m bertology.pretrain --config configs/distilbert.py:tiny --workdir $R/distil $PRE --config.teacher_checkpoint=$R/teacher
$PY -m bertology.pretrain --config configs/tinybert.py:tiny --workdir $R/tinybert $PRE --config.teacher_checkpoint=$R/teacher
$PY -m bertology.finetune --config configs/finetune/embedded.py --workdir $R/ft_teacher --config.init_checkpoint=$R/teacher $FT
$PY -m bertology.finetune --config configs/finetune/embedded.py --workdir $R/ft_distil --config.init_checkpoint=$R/distil $FT
$PY -m bertology.finetune --config configs/finetune/tinybert.py:embedded --workdir $R/ft_tinybert --config.init_checkpoint=$R/tinybert --config.teacher_checkpoint=$R/ft_teacher $FT
$PY -m bertology.finetune --config configs/finetune/q8bert.py:embedded --workdir $R/ft_q8 --config.init_checkpoint=$R/teacher $FT
$PY -m bertology.finetune --config configs/finetune/embedded.py --workdir $R/ft_prune50 --config.init_checkpoint=$R/teacher $FT --config.prune.kind=magnitude --config.prune.sparsity=0.5
$PY -m bertology.finetune --config configs/finetune/embedded.py --workdir $R/ft_prune90 --config.init_checkpoint=$R/teacher $FT --config.prune.kind=magnitude --config.prune.sparsity=0.9
