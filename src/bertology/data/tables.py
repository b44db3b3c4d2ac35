"""Tables as Hugging Face `datasets` keeps them on local disk, read with pyarrow.

- a `.parquet` file (what the Hub serves and `Dataset.to_parquet` writes);
- an `.arrow` file: Arrow's IPC stream format, as `datasets` writes its cache and shards (its
  `ArrowWriter` is a `RecordBatchStreamWriter`), or the IPC file format (Feather v2);
- a directory written by `Dataset.save_to_disk`: `state.json` lists its Arrow shards
  (`_data_files`), in order. A `DatasetDict`'s directory (`dataset_dict.json` and one directory
  per split) is not one table: the error names its splits' directories.

The `datasets` library itself is not needed to read any of them.
"""

from __future__ import annotations

import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

from bertology.errors import UserError

SUFFIXES = (".parquet", ".arrow")


def is_table(path: pathlib.Path) -> bool:
    """Whether `path` is read here (a parquet or Arrow file, or a `save_to_disk` directory)."""
    return path.is_dir() or path.suffix.lower() in SUFFIXES


def is_saved(path: pathlib.Path) -> bool:
    """Whether `path` is a directory `save_to_disk` wrote (a Dataset's, or a DatasetDict's)."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def shards(path: pathlib.Path) -> list[pathlib.Path]:
    """The files holding the table's rows, in order: the file itself, or a `save_to_disk`
    directory's Arrow shards (with its state.json, so a cache keyed on them notices a rewrite)."""
    if not path.is_dir():
        return [path]
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise UserError(f"{path} holds a DatasetDict ({', '.join(splits)}); name one split's directory, "
                        f"e.g. {path / (splits[0] if splits else 'train')}")
    state = path / "state.json"
    if not state.is_file():
        raise UserError(f"{path} is a directory without state.json; give a file, or a directory Dataset.save_to_disk wrote")
    try:
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"{state}: not the state.json Dataset.save_to_disk writes (no _data_files list); "
                        "save the dataset again") from None
    if missing := [f.name for f in files if not f.is_file()]:
        raise UserError(f"{path}: its state.json lists {missing}, which are not there; save the dataset again")
    return [*files, state]


def rows(path: pathlib.Path) -> int:
    """How many rows the table has, from parquet's footer or the Arrow batches' lengths (memory-mapped)."""
    files = [f for f in shards(path) if f.suffix.lower() in SUFFIXES]
    return sum(pq.ParquetFile(f).metadata.num_rows if f.suffix.lower() == ".parquet" else _read_file(f).num_rows
               for f in files)


def read(path: pathlib.Path, columns: list[str] | None = None) -> pa.Table:
    """The table (a directory's shards concatenated in order); `columns`: only those (a parquet
    file then reads nothing else; Arrow files are memory-mapped, so unread columns cost nothing)."""
    files = [f for f in shards(path) if f.suffix.lower() in SUFFIXES]
    try:
        tables = [_read_file(f, columns) for f in files]
        return pa.concat_tables(tables) if len(tables) != 1 else tables[0]
    except pa.ArrowInvalid as e:
        raise UserError(f"{path}: the tables of its shards differ ({str(e).splitlines()[0]}); save the dataset again") from None


def _read_file(path: pathlib.Path, columns: list[str] | None = None) -> pa.Table:
    try:
        if path.suffix.lower() == ".parquet":
            schema = pq.read_schema(path)
            return pq.read_table(path, columns=[c for c in columns if c in schema.names] if columns else None)
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
        return table.select([c for c in columns if c in table.column_names]) if columns else table
    except (pa.ArrowInvalid, OSError) as e:
        kind = "parquet" if path.suffix.lower() == ".parquet" else "Arrow IPC"
        raise UserError(f"{path}: not a {kind} file ({str(e).splitlines()[0][:120]}); write it again") from None
