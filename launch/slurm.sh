#!/usr/bin/env bash
# Pretrain on a SLURM cluster: one task per GPU (or per node), all running bertology.pretrain.
#
#   launch/slurm.sh [--dry-run] [--nodes N] [--gpus-per-node G] [--per-node] [--partition P]
#                   [--time HH:MM:SS] CONFIG WORKDIR [--config.key=value ...]
#
# It writes an sbatch script and submits it. Inside the job, `srun` starts the tasks and each
# joins the run through JAX's SLURM detection (coordinator = the first node of the job, from
# SLURM_STEP_NODELIST; process id = SLURM_PROCID), so no address is passed by hand. The
# workdir must be on a filesystem all nodes share. --dry-run prints the script and the command.
set -euo pipefail
dry_run= nodes=1 gpus=8 per_node= partition= time_limit=24:00:00
while [[ $# -gt 0 && $1 == --* && $1 != --config* ]]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --per-node) per_node=1 ;;
    --nodes|--gpus-per-node|--partition|--time)
      [[ $# -ge 2 ]] || { echo "$0: $1 needs a value" >&2; exit 2; }
      case $1 in --nodes) nodes=$2 ;; --gpus-per-node) gpus=$2 ;; --partition) partition=$2 ;; --time) time_limit=$2 ;; esac
      shift ;;
    *) echo "$0: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ $# -lt 2 ]]; then
  echo "usage: $0 [--dry-run] [--nodes N] [--gpus-per-node G] [--per-node] CONFIG WORKDIR [overrides]" >&2
  exit 2
fi
config=$1 workdir=$2
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
if [[ -n $per_node ]]; then  # one process drives all GPUs of its node
  tasks="#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$gpus"
else  # one process per GPU; SLURM gives each task its own GPU
  tasks="#SBATCH --ntasks-per-node=$gpus
#SBATCH --gpus-per-task=1"
fi
train=$(printf '%q ' "$repo/.venv/bin/python" -m bertology.pretrain "--config=$config" "--workdir=$workdir" "$@")

script="#!/usr/bin/env bash
#SBATCH --job-name=bertology
#SBATCH --nodes=$nodes
$tasks
#SBATCH --time=$time_limit
#SBATCH --output=bertology-%j.out
${partition:+#SBATCH --partition=$partition
}set -euo pipefail
cd $(printf '%q' "$repo")
srun --kill-on-bad-exit=1 $train"

if [[ -n $dry_run ]]; then
  printf '%s\n' "$script"
  echo "sbatch <the script above>"
  exit 0
fi
file=$(mktemp --suffix=.sbatch)
printf '%s\n' "$script" >"$file"
echo "sbatch $file"
exec sbatch "$file"
