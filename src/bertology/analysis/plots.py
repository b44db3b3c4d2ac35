"""The plotting the analysis tools share: matplotlib without a display, written atomically."""

from __future__ import annotations

import pathlib
from typing import Any

from bertology.files import atomic_file


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display on a pod or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: pathlib.Path) -> None:
    """`fig` as a PNG at `path` (written beside it, then renamed), then closed."""
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    pyplot().close(fig)
