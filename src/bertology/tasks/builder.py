"""One TFDS builder for every downstream task: parsed once from local files into array_record.

Nothing can be downloaded here, so each task reads the files of its official release from a
local directory (`data.dir`) and hands this builder a parser per split. The parsed examples are
stored untokenized -- one checkpoint's vocabulary is not another's -- under a cache key made of
the task name and the input files (path, size, mtime), and read back with no TensorFlow through
`as_data_source`, as the pretraining corpus is (bertology.data.corpus).

Official releases have quirks (QQP's broken rows, IOB1 tags, ...), so a parser may skip or
convert rows; it says so in a `Read`, which is stored next to the cache and logged on every load,
so a run's log always tells how much of each file it trained and scored on. A labelled split
that keeps no example is an error: it means the file is not what the task expects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.data.corpus import default_cache_dir
from bertology.errors import UserError
from bertology.files import atomic_write, stamps

Example = dict[str, Any]


@dataclasses.dataclass
class Read:
    """What a parser made of one split's file: examples kept, rows skipped and rows converted, by reason."""

    source: str = ""  # the file read (set by the parser)
    kept: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    converted: dict[str, int] = dataclasses.field(default_factory=dict)
    first_skipped: int = 0  # the file line of the first row skipped (0: none, or the parser does not say)

    def skip(self, reason: str, line: int = 0) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skipped = self.first_skipped or line

    def convert(self, reason: str, n: int = 1) -> None:
        if n:
            self.converted[reason] = self.converted.get(reason, 0) + n

    def summary(self) -> str:
        parts = [f"{self.kept} read"]
        parts += [f"{n} skipped ({why})" for why, n in self.skipped.items()]
        parts += [f"{n} converted ({why})" for why, n in self.converted.items()]
        return ", ".join(parts)


# A parser fills in the `Read` it is given while it yields the examples of one split.
Parser = Callable[[Read], Iterator[Example]]


class Splits(dict):
    """{split: examples in file order}, plus `reads`: {split: the Read of its file}."""

    def __init__(self, examples: dict[str, list[Example]], reads: dict[str, Read]):
        super().__init__(examples)
        self.reads = reads


# The share of a file's rows a task may skip (data.max_skipped_fraction overrides it): more than this
# means a damaged or converted file, not a release.
MAX_SKIPPED_FRACTION = 0.01


def refuse_lossy(reads: dict[str, Read], allowed: float) -> None:
    """Stop with one line, naming the file and its first skipped line, where a split's parser
    skipped more than `allowed` of its rows."""
    for read in reads.values():
        skipped = sum(read.skipped.values())
        if skipped > allowed * (skipped + read.kept):
            why = ", ".join(f"{n} {reason}" for reason, n in read.skipped.items())
            raise UserError(f"{read.source}:{read.first_skipped}: {skipped} of {skipped + read.kept} rows skipped ({why}), "
                            f"more than {allowed:.0%}; repair the file (this line is the first), or set "
                            f"--config.data.max_skipped_fraction={skipped / (skipped + read.kept):.2f} to train on the rest")


def require(path: pathlib.Path, task: str, hint: str) -> pathlib.Path:
    """`path` if it exists; otherwise the one-line error that says what to put where."""
    if not path.is_file():
        raise UserError(f"{task}: missing {path}; {hint}")
    return path


def read_text(path: pathlib.Path) -> str:
    """The file's text, without the UTF-8 byte-order mark some releases start with (MRPC's)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text ({e.reason}); convert the file to UTF-8 "
                        "(e.g. iconv -f latin1 -t utf-8)") from None


class LocalTask(tfds.core.GeneratorBasedBuilder):
    """Examples of one task, one split per list; every example gets its parse order as `_order`."""

    # 1.1.0: parsers read MRPC's byte-order mark and skip broken rows; older caches hold -1 labels.
    # 1.2.0: the reads record the first skipped line
    VERSION = tfds.core.Version("1.2.0")

    def __init__(self, *, features: dict[str, Any], examples: dict[str, list[Example]] | None = None, **kwargs):
        self._features = features
        self._examples = examples or {}
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="A downstream task parsed from its official local files.",
            features=tfds.features.FeaturesDict({**self._features, "_order": np.int64}),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(examples) for split, examples in self._examples.items()}

    def _generate_examples(self, examples: list[Example]):
        for i, example in enumerate(examples):
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


def _parse(name: str, parsers: dict[str, Parser]) -> tuple[dict[str, list[Example]], dict[str, Read]]:
    """Every split parsed up front, so a bad file fails here with its own message, not inside TFDS."""
    examples, reads = {}, {}
    for split, parser in parsers.items():
        read = Read()
        examples[split] = list(parser(read))
        read.kept = len(examples[split])
        if not read.kept and not split.startswith("test"):
            why = "; ".join(f"{n} {reason}" for reason, n in read.skipped.items()) or "the file has no rows"
            raise UserError(f"{name}: {read.source or split} gave no labelled example ({why}); "
                            "use the task's official release files")
        reads[split] = read
    return examples, reads


def load(
    name: str,
    features: dict[str, Any],
    parsers: dict[str, Parser],
    files: list[pathlib.Path],
    cache_dir: str | pathlib.Path | None = None,
    log: Callable[[str], None] = print,
) -> Splits:
    """{split: examples in file order} with their `reads`, preparing the TFDS dataset on first use."""
    h = hashlib.sha256(f"{name}|{LocalTask.VERSION}".encode())
    h.update(stamps(files).encode())
    data_dir = pathlib.Path(cache_dir or default_cache_dir()) / "tasks" / f"{name}-{h.hexdigest()[:16]}"
    report = data_dir / "reads.json"
    builder = LocalTask(features=features, data_dir=str(data_dir), file_format="array_record")
    if builder.is_prepared() and report.is_file():
        reads = {split: Read(**r) for split, r in json.loads(report.read_text()).items()}
    else:
        examples, reads = _parse(name, parsers)
        if not builder.is_prepared():
            log(f"parsing {name} into {data_dir} (once; later runs reuse it)")
            builder = LocalTask(features=features, examples=examples, data_dir=str(data_dir), file_format="array_record")
            tfds.disable_progress_bar()
            try:
                builder.download_and_prepare()
            except FileExistsError:
                # Another process prepared the same files first (the directory is keyed by their
                # content) and TFDS's final rename found its copy: read that one.
                builder = LocalTask(features=features, data_dir=str(data_dir), file_format="array_record")
        atomic_write(report, json.dumps({s: dataclasses.asdict(r) for s, r in reads.items()}, indent=1))
    log(f"{name}: " + "; ".join(f"{split} {read.summary()}" for split, read in reads.items()))
    out = {}
    for split in parsers:
        source = builder.as_data_source(split=split)
        records = sorted(({k: _decode(v) for k, v in source[i].items()} for i in range(len(source))),
                         key=lambda r: r["_order"])
        out[split] = [{k: v for k, v in r.items() if k != "_order"} for r in records]
    return Splits(out, reads)
