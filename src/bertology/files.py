"""Writing files that other processes (a racing test worker, a second host, a resumed run) may
read at any moment: a reader sees the old file or the whole new one, never a partial write."""

from __future__ import annotations

import os
import pathlib
import tempfile


def atomic_write(path: str | os.PathLike, data: bytes | str) -> pathlib.Path:
    """Write `data` (str as UTF-8) to a temporary file beside `path`, then rename it over `path`."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path
