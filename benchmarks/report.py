"""Where every benchmark's results go: `out/<name>.jsonl` (one JSON object per measurement, for
plots and diffs) and `out/<name>.md` (a markdown table to paste into the README)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any


def cell(row: Mapping[str, Any], column: str, formats: Mapping[str, str]) -> str:
    """The column's value formatted, or a dash where this run did not measure it."""
    value = row.get(column)
    return "—" if value is None else formats.get(column, "{}").format(value)


def append(rows: Sequence[Mapping[str, Any]], out: pathlib.Path, name: str, columns: Sequence[str],
           formats: Mapping[str, str]) -> None:
    """Append the rows as JSON lines and as markdown rows (with a header when the table is new), and
    print both: a benchmark's numbers stay on record across runs instead of being overwritten."""
    out.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    print(lines, end="")
    with open(out / f"{name}.jsonl", "a") as f:
        f.write(lines)
    table = out / f"{name}.md"
    header = "" if table.exists() else "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    md = header + "".join("| " + " | ".join(cell(row, c, formats) for c in columns) + " |\n" for row in rows)
    print(md, end="")
    with open(table, "a") as f:
        f.write(md)
