#!/usr/bin/env bash
# Run pretraining on this machine, on all its accelerators (or N simulated CPU devices).
#
#   launch/local.sh CONFIG WORKDIR [--config.key=value ...]
#   SIMULATE_DEVICES=8 launch/local.sh configs/bert.py:tiny runs/tiny8 --config.mesh.shape='(4,2)'
#   DRY_RUN=1 launch/local.sh configs/bert.py:base runs/base     # print the command only
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 CONFIG WORKDIR [--config.key=value ...]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
config=$1 workdir=$2
shift 2
py=${PYTHON:-.venv/bin/python}
if [[ -n "${SIMULATE_DEVICES:-}" ]]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${SIMULATE_DEVICES}" JAX_PLATFORMS=cpu
fi
cmd=("$py" -m bertology.pretrain "--config=$config" "--workdir=$workdir" "$@")
if [[ -n "${DRY_RUN:-}" ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
