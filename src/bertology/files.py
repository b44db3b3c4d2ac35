"""Writing files that other processes (a racing test worker, a second host, a resumed run, a
user's next command) may read at any moment: a reader sees the old artefact or the whole new one,
never a partial write, whenever the writer is killed (kill -9 included)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator

from etils import epath

_UMASK = os.umask(0o22)
os.umask(_UMASK)  # read once: mkstemp and mkdtemp create private (0600/0700) entries; ours get the usual modes


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """A temporary path beside `path` for any writer (safetensors, h5py, numpy, matplotlib) to
    fill; renamed over `path` when the block ends, removed if it raises."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = pathlib.Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> pathlib.Path:
    """Write `data` (str as UTF-8) to a temporary file beside `path`, then rename it over `path`."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return pathlib.Path(path)


def replace_text(path: str | os.PathLike, text: str) -> None:
    """`atomic_write` for a path that may be on object storage (gs://), where a write is whole by itself."""
    if is_remote(path):
        epath.Path(path).write_text(text)
    else:
        atomic_write(path, text)


def atomic_copy(source: str | os.PathLike, path: str | os.PathLike) -> pathlib.Path:
    """`shutil.copyfile` through a temporary name."""
    with atomic_file(path) as tmp:
        shutil.copyfile(source, tmp)
    return pathlib.Path(path)


@contextlib.contextmanager
def new_directory(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """A temporary directory beside `path` to fill; renamed to `path` when the block ends (a
    directory appears whole or not at all), removed if it raises. `path` must not exist yet, or be
    empty: the rename cannot merge into a directory that holds something."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_remote(path: str | os.PathLike) -> bool:
    """A cloud path (gs://, s3://): no appends, no renames, no local-file APIs."""
    return "://" in str(path)


def stamps(paths: Iterable[pathlib.Path]) -> str:
    """One line per file, `absolute path|size|mtime_ns`: what a cache keyed on its input files
    hashes or compares, so that a file rewritten in place invalidates it."""
    lines = []
    for path in paths:
        st = path.stat()
        lines.append(f"{path.absolute()}|{st.st_size}|{st.st_mtime_ns}\n")
    return "".join(lines)
