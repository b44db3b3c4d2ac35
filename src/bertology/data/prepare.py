"""Corpus preparation in parallel: text in, tokenized documents out as sharded array_record.

A corpus is cut into *tasks* of about `CHUNK_BYTES` each (byte ranges of a file that start and
end at document boundaries, or record ranges of a TFDS dataset). Each task is tokenized by one
of N worker processes and written to its own shard, `shard-{task:05d}.array_record`, one record
per document in input order. The task list depends on the input alone, never on N, so the
shards are the same bytes for any number of workers, and document g of the corpus is record g
of the shards taken in order.

Input formats (by file suffix; a directory may mix them, its files are taken sorted by path):
- text (any other suffix): BERT's format, one sentence per line, a blank line between documents.
- JSON lines (`.jsonl`, `.json`): one JSON object per line with a string field `text`, one
  document per line; sentences are split by `split_sentences` (the rule is written there).
- Hugging Face `datasets` tables (`.parquet`, `.arrow`, a `save_to_disk` directory:
  `bertology.data.tables`): one document per row, its text in the column `data.text_column`
  names ("text" by default), split into sentences like JSON lines; a task is a range of rows.
- `tfds:NAME@DATA_DIR` (NAME may carry a config and version, `wikipedia/20230601.en`): a TFDS
  dataset prepared elsewhere as array_record under DATA_DIR, its `train` split read by index, each
  example's `text` feature one document, split into sentences like JSON lines.
Files are opened through `etils.epath`, so a task may read `gs://` when the engine runs elsewhere.

Two engines run the same `run_task` over the same plan: `prepare` here (worker processes on one
machine) and `bertology.data.beam` (an Apache Beam pipeline: Dataflow, Spark, Flink).

A record is int32 `[n_sentences, len_1 ... len_n, tokens ...]`: `decode` turns it back into a
list of per-sentence id arrays without a protobuf schema or TensorFlow.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import time
from typing import Iterable, Iterator, Sequence

import numpy as np
from etils import epath

from bertology.data import tables
from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError

CHUNK_BYTES = 4 << 20  # input per task; small enough to balance 64 workers on a few GB
JSON_SUFFIXES = (".jsonl", ".json")
TFDS_PREFIX = "tfds:"
META = "meta.json"
# A sentence ends at . ! or ? (and any closing quotes or brackets after it) followed by
# whitespace and an upper-case letter, a digit or an opening quote: "Dr. smith" stays whole, "It
# rained. Then" splits. Newlines inside the text always end a sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(\[])")


def split_sentences(text: str) -> list[str]:
    """One JSON-lines or TFDS document as sentences, by the rule of `_SENTENCE_END` (regular
    expressions, not a trained splitter: the same split on every host and version)."""
    out = []
    for paragraph in text.splitlines():
        out.extend(s.strip() for s in _SENTENCE_END.split(paragraph.strip()) if s.strip())
    return out


@dataclasses.dataclass(frozen=True)
class Task:
    """One shard's input: bytes [start, stop) of a file, or records [start, stop) of a TFDS split."""

    source: str
    kind: str  # "text" | "jsonl" | "tfds" | "table"
    start: int
    stop: int
    size: int  # bytes, for progress (for TFDS and tables: an estimate)
    column: str = "text"  # a table's text column


def encode_document(sentences: Sequence[Sequence[int]]) -> bytes:
    """One document as a record: int32 [n, len_1 .. len_n, tokens ...]; empty sentences dropped."""
    kept = [np.asarray(s, np.int32) for s in sentences if len(s)]
    head = np.array([len(kept), *map(len, kept)], np.int32)
    return np.concatenate([head, *kept]).astype(np.int32).tobytes()


def decode(record: bytes) -> list[np.ndarray]:
    """A record back into its per-sentence int32 token arrays."""
    flat = np.frombuffer(record, np.int32)
    n = int(flat[0])
    ends = (np.cumsum(flat[: n + 1]) + 1).tolist()  # n + 1, then + each length: the sentences' bounds in `flat`
    return [flat[a:b] for a, b in zip(ends, ends[1:])]  # slices, not np.split: ~20x faster per document


def _kind(path: pathlib.Path) -> str:
    suffix = path.suffix.lower()
    return "jsonl" if suffix in JSON_SUFFIXES else "table" if suffix in tables.SUFFIXES else "text"


def _text_boundaries(path: pathlib.Path, chunk_bytes: int) -> list[int]:
    """Byte offsets that cut a text file into chunks of about `chunk_bytes` at blank lines (a
    chunk never splits a document); for JSON lines, at line ends."""
    size = epath.Path(path).stat().length
    cuts = [0]
    blank = _kind(path) == "text"
    with epath.Path(path).open("rb") as f:
        target = chunk_bytes
        while target < size:
            f.seek(target)
            f.readline()  # on to the start of the next line
            while True:
                here = f.tell()
                line = f.readline()
                if not line or not blank:
                    break
                if not line.strip():
                    here = f.tell()  # just after the blank line
                    break
            if not line or here >= size:
                break
            cuts.append(here)
            target = here + chunk_bytes
    return cuts + [size]


def parse_tfds(corpus: str) -> tuple[str, pathlib.Path]:
    """('NAME', DATA_DIR) of a `tfds:NAME@DATA_DIR` corpus."""
    name, sep, data_dir = corpus[len(TFDS_PREFIX):].partition("@")
    if not name or not sep or not data_dir:
        raise UserError(f"data.corpus={corpus!r} is not tfds:NAME@DATA_DIR; e.g. tfds:wikipedia/20230601.en@/data/tfds")
    return name, pathlib.Path(data_dir).expanduser()


def _tfds_directory(corpus: str) -> pathlib.Path:
    """The prepared dataset's directory (where its dataset_info.json is), for the workers."""
    import tensorflow_datasets as tfds

    name, data_dir = parse_tfds(corpus)
    try:
        builder = tfds.builder(name, data_dir=str(data_dir))
    except Exception as e:  # an unknown name or a missing directory: TFDS raises many kinds
        raise UserError(f"TFDS dataset {name!r} could not be opened under {data_dir} ({type(e).__name__}); "
                        "prepare it there first (tfds build NAME --data_dir DIR --file_format array_record)") from e
    if not builder.is_prepared():
        raise UserError(f"TFDS dataset {name!r} is not prepared under {data_dir}; prepare it there first "
                        "(tfds build NAME --data_dir DIR --file_format array_record)")
    return pathlib.Path(builder.data_dir)


def _tfds_source(directory: str):
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(directory)
    try:
        return builder.as_data_source(split="train")
    except Exception as e:  # tfrecord-prepared datasets cannot be read by index
        raise UserError(f"TFDS dataset at {directory} cannot be read by index ({type(e).__name__}); prepare it with "
                        "--file_format array_record") from e


def plan(corpus: str | os.PathLike, files: Sequence[pathlib.Path], chunk_bytes: int = CHUNK_BYTES,
         text_column: str = "text") -> list[Task]:
    """The tasks of a corpus, in corpus order (each one shard); a table's text is `text_column`."""
    if str(corpus).startswith(TFDS_PREFIX):
        directory = str(_tfds_directory(str(corpus)))
        n = len(_tfds_source(directory))
        per = max(1, chunk_bytes // 2048)  # ~2 kB per example: Wikipedia's mean article
        return [Task(directory, "tfds", lo, min(lo + per, n), (min(lo + per, n) - lo) * 2048) for lo in range(0, n, per)]
    tasks = []
    for path in files:
        if _kind(path) == "table":
            n, size = tables.rows(path), path.stat().st_size
            per = max(1, chunk_bytes * n // max(size, 1))  # rows of about chunk_bytes
            tasks += [Task(str(path), "table", lo, min(lo + per, n), size * (min(lo + per, n) - lo) // max(n, 1),
                           text_column) for lo in range(0, n, per)]
            continue
        cuts = _text_boundaries(path, chunk_bytes)
        tasks += [Task(str(path), _kind(path), lo, hi, hi - lo) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
    return tasks


def task_documents(task: Task) -> Iterator[list[str]]:
    """The documents of one task as lists of sentences; blank lines and the range's end close a
    text document (as reading the whole file would: ranges end at blank lines)."""
    if task.kind == "table":
        table = tables.read(pathlib.Path(task.source), [task.column])
        if task.column not in table.column_names:
            names = tables.read(pathlib.Path(task.source)).schema.names
            raise UserError(f"corpus file {task.source} has no column {task.column!r} (it has {names}); "
                            "set data.text_column to the column holding the text")
        for number, text in enumerate(table.column(task.column).slice(task.start, task.stop - task.start).to_pylist(),
                                      task.start + 1):
            if not isinstance(text, str):
                raise UserError(f"corpus file {task.source}: row {number}'s {task.column!r} is "
                                f"{type(text).__name__}, not text; fix or remove it")
            yield split_sentences(text)
        return
    if task.kind == "tfds":
        source = _tfds_source(task.source)
        for i in range(task.start, task.stop):
            text = source[i]["text"]
            yield split_sentences(text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text))
        return
    with epath.Path(task.source).open("rb") as f:
        f.seek(task.start)
        raw = f.read(task.stop - task.start)
    lines = io.StringIO(raw.decode("utf-8", errors="replace"), newline=None)
    if task.kind == "jsonl":
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
                if not isinstance(text, str):
                    raise TypeError(type(text).__name__)
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"corpus file {task.source}: line {number + 1} after byte {task.start} is not a JSON "
                                f"object with a string 'text' field ({type(e).__name__}); fix or remove it") from e
            yield split_sentences(text)
        return
    yield from text_documents(lines)


def text_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """BERT's format: documents as lists of sentence lines; blank lines and the end close one."""
    doc: list[str] = []
    for line in lines:
        line = line.strip()
        if line:
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


_WORKER_TOKENIZER: Tokenizer | None = None  # a worker process's tokenizer, its caches kept across tasks


def _start_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def run_task(index: int, task: Task, tokenizer: Tokenizer | None, out_dir: str) -> int:
    """Tokenize one task into shard `index` of the local directory `out_dir` (with the worker's
    tokenizer when None); returns its number of documents. Both engines run this, so their shards
    are the same bytes."""
    from array_record.python.array_record_module import ArrayRecordWriter

    tokenizer = tokenizer or _WORKER_TOKENIZER

    path = os.path.join(out_dir, shard_name(index))
    writer = ArrayRecordWriter(path, "group_size:1")  # one document per chunk: cheap reads by index
    n = 0
    for doc in task_documents(task):
        writer.write(encode_document([tokenizer.encode(s) for s in doc]))
        n += 1
    writer.close()
    return n


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.array_record"


def default_workers() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def metadata(tasks: Sequence[Task], counts: Sequence[int], seconds: float, tokenizer_digest: str, **engine) -> dict:
    """META of a prepared corpus (both engines): {"shards": [file names], "documents": [per shard],
    "bytes": input bytes, "seconds": wall, "tokenizer": digest of its files, **engine}. The digest
    lets a prepared directory given as the corpus refuse a run with another vocabulary."""
    return {"shards": [shard_name(i) for i in range(len(tasks))], "documents": list(counts),
            "bytes": sum(t.size for t in tasks), "seconds": seconds, "tokenizer": tokenizer_digest, **engine}


def prepare(tasks: Sequence[Task], tokenizer: Tokenizer, out_dir: str | os.PathLike, *, workers: int | None = None,
            progress: bool = True, tokenizer_digest: str = "") -> dict:
    """Tokenize `tasks` into `out_dir` with `workers` processes (default: the cores; 1 runs here),
    writing META last so a crashed preparation is never read. Returns the metadata (`metadata`)."""
    from tqdm import tqdm

    out = pathlib.Path(out_dir)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    workers = max(1, min(workers or default_workers(), len(tasks)))
    total = sum(t.size for t in tasks)
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="tokenizing", disable=not progress,
               smoothing=0.1)  # shows MB/s and the time left
    counts = [0] * len(tasks)
    start = time.perf_counter()
    if workers == 1:
        for i, task in enumerate(tasks):
            counts[i] = run_task(i, task, tokenizer, str(tmp))
            bar.update(task.size)
    else:
        context = multiprocessing.get_context("spawn")  # a forked JAX process may deadlock
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                    initargs=(tokenizer,)) as pool:
            futures = {pool.submit(run_task, i, t, None, str(tmp)): i for i, t in enumerate(tasks)}
            for future in concurrent.futures.as_completed(futures):
                i = futures[future]
                counts[i] = future.result()
                bar.update(tasks[i].size)
    bar.close()
    meta = metadata(tasks, counts, time.perf_counter() - start, tokenizer_digest, workers=workers)
    (tmp / META).write_text(json.dumps(meta))
    try:
        os.replace(tmp, out)
    except OSError:  # another process (a second host on a shared cache) finished first
        shutil.rmtree(tmp)
        if not (out / META).exists():
            raise
    return meta
