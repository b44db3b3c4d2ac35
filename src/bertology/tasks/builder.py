"""One TFDS builder for every downstream task: parsed once from local files into array_record.

Nothing can be downloaded here, so each task reads the files of its official release from a
local directory (`data.dir`) and hands this builder a parser per split. The parsed examples are
stored untokenized -- one checkpoint's vocabulary is not another's -- under a cache key made of
the task name and the input files (path, size, mtime), and read back with no TensorFlow through
`as_data_source`, as the pretraining corpus is (bertology.data.corpus).
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.data.corpus import default_cache_dir
from bertology.errors import UserError

Example = dict[str, Any]
Parser = Callable[[], Iterator[Example]]


def require(path: pathlib.Path, task: str, hint: str) -> pathlib.Path:
    """`path` if it exists; otherwise the one-line error that says what to put where."""
    if not path.is_file():
        raise UserError(f"{task}: missing {path}; {hint}")
    return path


class LocalTask(tfds.core.GeneratorBasedBuilder):
    """Examples of one task, one split per parser; every example gets its parse order as `_order`."""

    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, features: dict[str, Any], parsers: dict[str, Parser], **kwargs):
        self._features = features
        self._parsers = parsers
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="A downstream task parsed from its official local files.",
            features=tfds.features.FeaturesDict({**self._features, "_order": np.int64}),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(parser) for split, parser in self._parsers.items()}

    def _generate_examples(self, parser: Parser):
        for i, example in enumerate(parser()):
            yield i, {**example, "_order": i}


def _decode(value: Any) -> Any:
    """Bytes back to str and numpy scalars/arrays to Python values, recursively."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)):
        return [_decode(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_decode(v) for v in value.tolist()] if value.ndim else _decode(value.item())
    if isinstance(value, np.generic):
        return value.item()
    return value


def load(
    name: str,
    features: dict[str, Any],
    parsers: dict[str, Parser],
    files: list[pathlib.Path],
    cache_dir: str | pathlib.Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[Example]]:
    """{split: examples in file order}, preparing the TFDS dataset on first use."""
    h = hashlib.sha256(f"{name}|{LocalTask.VERSION}".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.absolute()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    data_dir = pathlib.Path(cache_dir or default_cache_dir()) / "tasks" / f"{name}-{h.hexdigest()[:16]}"
    builder = LocalTask(features=features, parsers=parsers, data_dir=str(data_dir), file_format="array_record")
    if not builder.is_prepared():
        log(f"parsing {name} into {data_dir} (once; later runs reuse it)")
        tfds.disable_progress_bar()
        builder.download_and_prepare()
    out = {}
    for split in parsers:
        source = builder.as_data_source(split=split)
        records = sorted(({k: _decode(v) for k, v in source[i].items()} for i in range(len(source))),
                         key=lambda r: r["_order"])
        out[split] = [{k: v for k, v in r.items() if k != "_order"} for r in records]
    return out
