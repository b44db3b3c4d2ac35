"""The pod and cluster launchers' dry runs print exactly the commands they would run."""

import shlex
import subprocess

import pytest
from helpers import REPO


def dry_run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "launch" / script), "--dry-run", *args], capture_output=True, text=True)


def test_tpu_pod_creates_copies_installs_and_runs_on_every_worker():
    out = dry_run("tpu_pod.sh", "--create", "--name", "pod", "--zone", "us-central2-b", "--accelerator", "v4-64",
                  "configs/bert.py:base", "gs://bucket/runs/base", "--config.mesh.strategy=fsdp", "--config.mesh.shape=(-1,1)")
    assert out.returncode == 0, out.stderr
    create, archive, copy, install, train = [shlex.split(line) for line in out.stdout.splitlines()]
    assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"] and "--accelerator-type=v4-64" in create
    assert archive[:2] == ["git", "archive"] and archive[-1] == "HEAD"
    assert copy[4] == "scp" and copy[-1] == "--worker=all" and copy[6] == "pod:bertology.tar.gz"
    for cmd in (install, train):
        assert cmd[4:6] == ["ssh", "pod"] and "--zone=us-central2-b" in cmd and "--worker=all" in cmd
    assert ".[tpu]" in install[-1]  # the extra with jax[tpu], gcsfs, google-cloud-storage
    remote = shlex.split(train[-1].removeprefix("--command="))
    assert remote[:3] == ["cd", "bertology", "&&"]
    assert remote[3:] == [".venv/bin/python", "-m", "bertology.pretrain", "--config=configs/bert.py:base",
                          "--workdir=gs://bucket/runs/base", "--distributed", "--config.mesh.strategy=fsdp",
                          "--config.mesh.shape=(-1,1)"]


def test_tpu_pod_without_create_uses_the_existing_slice():
    out = dry_run("tpu_pod.sh", "--name", "pod", "--zone", "z", "configs/bert.py:tiny", "gs://b/w")
    assert out.returncode == 0 and "create" not in out.stdout and len(out.stdout.splitlines()) == 4


@pytest.mark.parametrize("args, message", [
    (["--name", "pod", "--zone", "z", "configs/bert.py:tiny", "runs/local"], "must be a gs:// path"),
    (["--zone", "z", "configs/bert.py:tiny", "gs://b/w"], "usage:"),
    (["--name"], "--name needs a value"),
])
def test_tpu_pod_bad_input_is_one_line(args, message):
    out = dry_run("tpu_pod.sh", *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.splitlines()) == 1


def test_slurm_one_task_per_gpu_by_default():
    out = dry_run("slurm.sh", "--nodes", "2", "--gpus-per-node", "4", "--partition", "a100",
                  "configs/bert.py:base", "/shared/runs/base", "--config.batch_size=512")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    sbatch = {l.split("=")[0].removeprefix("#SBATCH "): l.split("=", 1)[1] for l in lines if l.startswith("#SBATCH")}
    assert sbatch["--nodes"] == "2" and sbatch["--ntasks-per-node"] == "4" and sbatch["--gpus-per-task"] == "1"
    assert sbatch["--partition"] == "a100"
    (srun,) = [shlex.split(l) for l in lines if l.startswith("srun")]
    assert srun[2:] == [f"{REPO}/.venv/bin/python", "-m", "bertology.pretrain", "--config=configs/bert.py:base",
                        "--workdir=/shared/runs/base", "--config.batch_size=512"]
    assert lines[-1] == "sbatch <the script above>"


def test_slurm_one_task_per_node():
    out = dry_run("slurm.sh", "--per-node", "--gpus-per-node", "8", "configs/bert.py:base", "/shared/w")
    assert "#SBATCH --ntasks-per-node=1" in out.stdout and "#SBATCH --gpus-per-node=8" in out.stdout
    assert "--partition" not in out.stdout


def test_slurm_bad_option_is_one_line():
    out = dry_run("slurm.sh", "--gpus", "8", "configs/bert.py:base", "/shared/w")
    assert out.returncode == 2 and out.stderr.strip() == f"{REPO}/launch/slurm.sh: unknown option --gpus"
