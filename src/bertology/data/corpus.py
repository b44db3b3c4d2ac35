"""A local corpus, tokenized once in parallel into sharded array_record and read by index.

Input is a text file or directory in BERT's format, JSON lines, Hugging Face `datasets` tables
(parquet, Arrow, a `save_to_disk` directory, or `hf:NAME` from the local `datasets` cache:
`hub.py`), or a TFDS dataset by name (`prepare.py` has the formats and the parallel writer), or
a directory prepared already (one
holding prepare's `meta.json`, e.g. written by the Beam pipeline `bertology.data.beam`), read as
is. Document g of the corpus is record g of the shards; every ~50th document is held out for
`validation`, so evaluation never sees training text. `load_documents` returns each split as a
`Documents` sequence that reads a document from disk when it is indexed: memory does not grow
with the corpus.

The prepared data is cached under a key made of the corpus files (path, size, mtime) and the
tokenizer file's content, so editing either rebuilds it and nothing stale is ever read.
"""

from __future__ import annotations

import codecs
import collections.abc
import concurrent.futures
import hashlib
import json
import os
import pathlib
import threading
from typing import Callable, Iterator

import numpy as np

from bertology.data import hub, tables
from bertology.data import prepare as prepare_lib
from bertology.data.tokenizers import Tokenizer, tokenizer_files
from bertology.errors import UserError
from bertology.files import stamps

Document = list[np.ndarray]  # one int32 array of token ids per sentence
EVAL_EVERY = 50  # document i is held out when (i + 1) % EVAL_EVERY == 0
MIN_DOCUMENTS = 3
# A file with more than this fraction of NUL characters or invalid UTF-8 sequences is not text
# (random bytes, images, archives); below it, the stray bytes of real text are replaced and counted.
NOT_TEXT_FRACTION = 0.01
_CHUNK = 1 << 20
FORMAT = 2  # 1: one TFDS example per document; 2: prepare.py records in shards


def corpus_files(corpus: str | pathlib.Path) -> list[pathlib.Path]:
    """The files of a corpus path (a file, every file under a directory, sorted, or the Arrow
    shards of a `save_to_disk` directory or of `hf:NAME`'s cached train split, in order)."""
    if str(corpus).startswith(prepare_lib.TFDS_PREFIX):
        return []  # a prepared TFDS dataset: no local text files
    if str(corpus).startswith(hub.PREFIX):
        return hub.train_files(str(corpus))
    path = pathlib.Path(corpus).expanduser()
    if not path.exists():
        raise UserError(f"corpus not found: {path}; set data.corpus to a text file or a directory of them")
    if tables.is_saved(path):
        return [f for f in tables.shards(path) if f.suffix == ".arrow"]
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"corpus directory {path} holds no files; put one-sentence-per-line text files in it")
    return files


def check_text(files: list[pathlib.Path]) -> int:
    """Refuse, by name, the first file that is not text; return how many stray NULs and invalid
    UTF-8 sequences the others hold (reading replaces each by U+FFFD, as `read_documents` does).

    Tokenizing binary data "works" -- every byte becomes [UNK] or a byte token -- so a wrong path
    would otherwise train on garbage without a word. The first MiB decides for most binary files."""
    stray = 0
    for file in files:
        if file.suffix.lower() in tables.SUFFIXES:
            continue  # binary by design; their text column is checked as it is read
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        bad = chars = 0
        with open(file, "rb") as f:
            while True:
                raw = f.read(_CHUNK)
                text = decoder.decode(raw, final=not raw)
                bad += text.count("\ufffd") - raw.count("\ufffd".encode()) + text.count("\x00")
                chars += len(text)
                if bad > NOT_TEXT_FRACTION * max(chars, 1) and (chars >= _CHUNK or not raw):
                    raise UserError(
                        f"corpus file {file} is not text ({bad / chars:.0%} NUL or invalid UTF-8); "
                        "remove it or point the corpus at UTF-8 text files"
                    )
                if not raw:
                    break
        stray += max(bad, 0)
    return stray


def read_documents(files: list[pathlib.Path]) -> Iterator[list[str]]:
    """Documents of BERT-format files as lists of sentence lines (what preparation tokenizes)."""
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as f:
            yield from prepare_lib.text_documents(f)


def tokenizer_digest(tokenizer_path: str | pathlib.Path) -> str:
    """The tokenizer files' content hash (a byte-level BPE is two files: vocab.json, merges.txt)."""
    h = hashlib.sha256()
    for f in tokenizer_files(tokenizer_path):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def is_prepared(corpus: str | pathlib.Path) -> bool:
    """Whether the corpus is a prepared directory (shards + meta.json) rather than text."""
    if str(corpus).startswith(prepare_lib.TFDS_PREFIX):
        return False
    return (pathlib.Path(corpus).expanduser() / prepare_lib.META).is_file()


def cache_key(corpus: str | pathlib.Path, files: list[pathlib.Path], tokenizer_path: str | pathlib.Path,
              text_column: str = "text") -> str:
    """What the prepared shards depend on: the input files, the tokenizer, the record layout (and
    for tables the text column)."""
    h = hashlib.sha256()
    h.update(stamps(files).encode())
    h.update(tokenizer_digest(tokenizer_path).encode())
    h.update(f"eval_every={EVAL_EVERY}|format={FORMAT}|chunk={prepare_lib.CHUNK_BYTES}|{corpus}".encode())
    if any(f.suffix.lower() in tables.SUFFIXES for f in files):
        h.update(f"|column={text_column}".encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("BERTOLOGY_CACHE", "~/.cache/bertology")).expanduser() / "tfds"


class Documents(collections.abc.Sequence):
    """The documents of one split, read from the shards when indexed (each a list of per-sentence
    int32 id arrays), so holding one costs nothing per document. Index i of `train` is corpus
    document `i + i // (EVAL_EVERY - 1)`, of `validation` `EVAL_EVERY * (i + 1) - 1` (with fewer
    than EVAL_EVERY documents, the last one is the only held-out document). `counts[s]` is how
    many records shard s holds (corpus document g is in the shard where the running total passes g).

    Shards are read with one array_record reader each, opened on first use, rather than through
    grain's ArrayRecordDataSource, whose batched read starts a thread pool per call: for a stream
    window that cost as much as the reading itself."""

    def __init__(self, paths: list[str], counts: list[int], split: str):
        self.paths, self.counts, self.split = list(paths), list(counts), split
        self.total = sum(self.counts)
        self._starts = np.cumsum([0, *self.counts])
        self._readers: list = [None] * len(self.paths)
        self._lock = threading.Lock()
        held_out = self.total // EVAL_EVERY or 1
        self._len = held_out if split == "validation" else self.total - held_out

    def __len__(self) -> int:
        return self._len

    def corpus_index(self, i: int) -> int:
        """Where document i of this split is in the corpus."""
        if self.total < EVAL_EVERY:
            return self.total - 1 if self.split == "validation" else i
        return EVAL_EVERY * (i + 1) - 1 if self.split == "validation" else i + i // (EVAL_EVERY - 1)

    def __getitem__(self, i: int | slice) -> list[np.ndarray] | list[list[np.ndarray]]:
        if isinstance(i, slice):
            return self.read(range(*i.indices(self._len)))
        if not -self._len <= i < self._len:
            raise IndexError(i)
        return self.read([i % self._len])[0]

    def read(self, indices: collections.abc.Iterable[int]) -> list[list[np.ndarray]]:
        """Several documents, one reader call per shard they are in."""
        keys = np.array([self.corpus_index(int(i)) for i in indices], np.int64)
        shard = np.searchsorted(self._starts, keys, side="right") - 1
        records: list[bytes] = [b""] * len(keys)
        for s in np.unique(shard).tolist():
            at = np.flatnonzero(shard == s)
            for k, record in zip(at.tolist(), self._reader(s).read((keys[at] - self._starts[s]).tolist())):
                records[k] = record
        return [prepare_lib.decode(r) for r in records]

    def _reader(self, s: int):
        """Shard s's reader (opened once; the prefetch thread and the caller may both ask)."""
        if self._readers[s] is None:
            from array_record.python.array_record_module import ArrayRecordReader

            with self._lock:
                if self._readers[s] is None:  # readahead off: reads are by index, not sequential
                    self._readers[s] = ArrayRecordReader(self.paths[s], "readahead_buffer_size:0")
        return self._readers[s]

    def __reduce__(self) -> tuple:  # pickled as its paths: a worker reopens the shards
        return Documents, (self.paths, self.counts, self.split)


def _check_files(files: list[pathlib.Path], workers: int) -> int:
    """`check_text` over the files, several at a time: the stray-byte count of all of them."""
    if workers == 1 or len(files) == 1:
        return check_text(files)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(lambda f: check_text([f]), files))


def load_documents(
    corpus: str | pathlib.Path,
    tokenizer: Tokenizer,
    tokenizer_path: str | pathlib.Path,
    cache_dir: str | pathlib.Path | None = None,
    log: Callable[[str], None] = print,
    workers: int | None = None,
    progress: bool = True,
    text_column: str = "text",
) -> dict[str, Documents]:
    """{'train': docs, 'validation': docs} in corpus order, preparing the corpus first (with
    `workers` processes, default the cores) unless it is cached or a prepared directory;
    `text_column`: a table corpus's text."""
    if is_prepared(corpus):
        data_dir = pathlib.Path(corpus).expanduser()
        meta = json.loads((data_dir / prepare_lib.META).read_text())
        if meta.get("tokenizer") != tokenizer_digest(tokenizer_path):
            raise UserError(f"prepared corpus {data_dir} was tokenized with another vocabulary than {tokenizer_path}; "
                            "set data.vocab to the one it was prepared with, or prepare it again with this one")
        return _splits(corpus, data_dir, meta)
    files = corpus_files(corpus)
    if files and all(f.stat().st_size == 0 for f in files):
        raise UserError(f"corpus {corpus} is empty; it needs text, one sentence per line")
    data_dir = pathlib.Path(cache_dir or default_cache_dir()) / cache_key(corpus, files, tokenizer_path, text_column)
    meta_path = data_dir / prepare_lib.META
    if not meta_path.exists():
        workers = workers or prepare_lib.default_workers()
        stray = _check_files(files, workers)
        if stray:
            log(f"corpus {corpus}: replaced {stray} NUL or invalid UTF-8 sequence(s) (under {NOT_TEXT_FRACTION:.0%} "
                "of the text, so kept as text)")
        log(f"tokenizing corpus {corpus} into {data_dir} with {workers} process(es) (once; later runs reuse it)")
        prepare_lib.prepare(prepare_lib.plan(corpus, files, text_column=text_column), tokenizer, data_dir,
                            workers=workers, progress=progress,
                            tokenizer_digest=tokenizer_digest(tokenizer_path))
    return _splits(corpus, data_dir, json.loads(meta_path.read_text()))


def _splits(corpus: str | pathlib.Path, data_dir: pathlib.Path, meta: dict) -> dict[str, Documents]:
    """The train and validation Documents of the shards in `data_dir` that META lists."""
    total = sum(meta["documents"])
    if total < MIN_DOCUMENTS:
        raise UserError(
            f"corpus {corpus} has {total} document(s); pretraining needs at least {MIN_DOCUMENTS} "
            "(one sentence per line, a blank line between documents)"
        )
    shards = [(str(data_dir / name), n) for name, n in zip(meta["shards"], meta["documents"]) if n]
    paths, counts = [p for p, _ in shards], [n for _, n in shards]
    return {split: Documents(paths, counts, split) for split in ("train", "validation")}
