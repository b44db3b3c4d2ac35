#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM slice: every worker runs the same `python -m bertology.pretrain`.
#
#   launch/tpu_pod.sh [--dry-run] [--create] --name NAME --zone ZONE [--accelerator v4-32]
#                     [--version tpu-ubuntu2204-base] [--spot] CONFIG gs://BUCKET/WORKDIR [--config.key=value ...]
#
# --create makes the slice first (else it must exist). The code at HEAD is packed with
# `git archive`, copied to every worker, and installed into a venv there with jax[tpu]; the
# workdir must be on GCS so all workers share checkpoints. --dry-run prints every command.
set -euo pipefail
dry_run= create= name= zone= accelerator=v4-32 version=tpu-ubuntu2204-base spot=
while [[ $# -gt 0 && $1 == --* && $1 != --config* ]]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --create) create=1 ;;
    --spot) spot=--spot ;;
    --name|--zone|--accelerator|--version)
      [[ $# -ge 2 ]] || { echo "$0: $1 needs a value" >&2; exit 2; }
      declare "${1#--}=$2"; shift ;;
    *) echo "$0: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ $# -lt 2 || -z $name || -z $zone ]]; then
  echo "usage: $0 [--dry-run] [--create] --name NAME --zone ZONE [--accelerator TYPE] CONFIG gs://BUCKET/WORKDIR [overrides]" >&2
  exit 2
fi
config=$1 workdir=$2
shift 2
if [[ $workdir != gs://* ]]; then
  echo "$0: the workdir must be a gs:// path that every worker can reach, got $workdir" >&2
  exit 2
fi
cd "$(dirname "$0")/.."

run() {  # print the command; run it unless --dry-run
  printf '%q ' "$@"; echo
  [[ -n $dry_run ]] || "$@"
}

tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
archive=/tmp/bertology-$name.tar.gz
train=$(printf '%q ' .venv/bin/python -m bertology.pretrain "--config=$config" "--workdir=$workdir" --distributed "$@")

if [[ -n $create ]]; then
  run "${tpu[@]}" create "$name" "${where[@]}" --accelerator-type="$accelerator" --version="$version" $spot
fi
run git archive --format=tar.gz --output="$archive" HEAD
run "${tpu[@]}" scp "$archive" "$name:bertology.tar.gz" "${where[@]}" --worker=all
run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command="mkdir -p bertology && tar -xzf bertology.tar.gz -C bertology && cd bertology && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command="cd bertology && $train"
