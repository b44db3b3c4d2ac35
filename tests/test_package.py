"""The package as a user gets it: `python -m build` makes the sdist (the repository: sources,
configs, tests) and the wheel from that sdist, so a file the sdist lacks fails here; the wheel is
installed into a fresh venv apart from the sources, whose console script lists the commands,
reports pyproject's version, explains `pretrain` with its config keys and runs the README's demo
pretraining for a few steps."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest
from helpers import REPO

from bertology.__main__ import COMMANDS

# Build outputs and environments that are no part of the sources (setuptools writes egg-info and
# build/ beside them: the build runs on a copy).
NOT_SOURCES = (".git", ".venv", "*_cache", ".cache-ci", "__pycache__", "*.egg-info", "build", "dist", "runs", "workdir*")


def files(root: pathlib.Path, *parts: str) -> set[str]:
    """The files under root/parts, relative to root (POSIX paths), caches left out."""
    return {p.relative_to(root).as_posix() for p in root.joinpath(*parts).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_sdist_and_wheel_install_apart_from_the_sources_and_run(tmp_path):
    source, dist, venv = tmp_path / "source", tmp_path / "dist", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # src/ is on it for some test runs
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True, env=env, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    (sdist,), (wheel,) = dist.glob("bertology-*.tar.gz"), dist.glob("bertology-*.whl")

    top = f"bertology-{version}/"
    in_sdist = {name.removeprefix(top) for name in tarfile.open(sdist).getnames()}
    assert {"README.md", "pyproject.toml"} <= in_sdist
    assert set().union(*(files(REPO, part) for part in ("src", "configs", "tests"))) - in_sdist == set()
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert {name.removeprefix("src/") for name in files(REPO, "src", "bertology", "data", "assets")} <= in_wheel
    entry_points = next(n for n in in_wheel if n.endswith(".dist-info/entry_points.txt"))
    assert "bertology = bertology.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "-q", "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, env=env,
                               timeout=600)
    assert installed.returncode == 0, installed.stderr
    # The test environment's packages (jax, flax, ...) without its bertology: a directory a .pth file
    # names joins sys.path, but its own .pth files (the editable install's, which adds src/) are not read.
    site = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")}
    pathlib.Path(site, "test_environment.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))

    def bertology(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "bertology", *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=600)

    where = subprocess.run([venv / "bin" / "python", "-c", "import bertology; print(bertology.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert pathlib.Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr
    shown = bertology("--help")
    assert shown.returncode == 0 and all(f"  {name}  " in shown.stdout for name in COMMANDS), shown.stdout
    assert bertology("--version").stdout == f"bertology {version}\n"
    explained = bertology("pretrain", "--help")
    assert explained.returncode == 0 and "\n  data.text_column ('text'): " in explained.stdout, explained.stderr[-2000:]

    run = tmp_path / "run"
    trained = bertology("pretrain", "--config", f"{REPO}/configs/bert.py:tiny", f"--workdir={run}",
                        "--config.total_steps=3", "--config.log_every=1", "--config.eval_every=0")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) >= 3
