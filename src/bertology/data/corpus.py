"""A local plain-text corpus as a TFDS dataset: tokenized once, stored as array_record.

Input is the original BERT pretraining format: one sentence per line, a blank line between
documents, in a file or a directory of files. The builder tokenizes every sentence once and
writes one record per document (`token_ids` flat, `sentence_lengths`, `doc_index`); later runs
read it back with no TensorFlow through `as_data_source`. Every ~50th document goes to the
`validation` split so evaluation never sees training text.

The prepared data is cached under a key made of the corpus files (path, size, mtime) and the
tokenizer file's content, so editing either rebuilds it and nothing stale is ever read.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.data.tokenizers import Tokenizer, tokenizer_files
from bertology.errors import UserError

Document = list[np.ndarray]  # one int32 array of token ids per sentence
EVAL_EVERY = 50  # document i is held out when (i + 1) % EVAL_EVERY == 0
MIN_DOCUMENTS = 3
# A file with more than this fraction of NUL characters or invalid UTF-8 sequences is not text
# (random bytes, images, archives); below it, the stray bytes of real text are replaced and counted.
NOT_TEXT_FRACTION = 0.01
_CHUNK = 1 << 20


def corpus_files(corpus: str | pathlib.Path) -> list[pathlib.Path]:
    """The text files of a corpus path (a file, or every file under a directory, sorted)."""
    path = pathlib.Path(corpus).expanduser()
    if not path.exists():
        raise UserError(f"corpus not found: {path}; set data.corpus to a text file or a directory of them")
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
    """Documents as lists of sentence lines; blank lines and file ends close a document."""
    for file in files:
        doc: list[str] = []
        with open(file, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
        if doc:
            yield doc


def _is_eval(index: int) -> bool:
    return (index + 1) % EVAL_EVERY == 0


class TextCorpus(tfds.core.GeneratorBasedBuilder):
    """TFDS builder over local text; one example per document."""

    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, files: list[pathlib.Path], tokenizer: Tokenizer, **kwargs):
        self._files = files
        self._tokenizer = tokenizer
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="A local one-sentence-per-line corpus, tokenized.",
            features=tfds.features.FeaturesDict(
                {
                    "token_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
                    "sentence_lengths": tfds.features.Tensor(shape=(None,), dtype=np.int32),
                    "doc_index": np.int64,
                }
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        n = sum(1 for _ in read_documents(self._files))
        if n < MIN_DOCUMENTS:
            raise UserError(
                f"corpus {self._files[0]} has {n} document(s); pretraining needs at least {MIN_DOCUMENTS} "
                "(one sentence per line, a blank line between documents)"
            )
        held_out = {i for i in range(n) if _is_eval(i)} or {n - 1}
        return {
            "train": self._generate_examples(lambda i: i not in held_out),
            "validation": self._generate_examples(lambda i: i in held_out),
        }

    def _generate_examples(self, keep):
        for index, doc in enumerate(read_documents(self._files)):
            if not keep(index):
                continue
            sentences = [np.asarray(self._tokenizer.encode(s), np.int32) for s in doc]
            sentences = [s for s in sentences if len(s)]
            if not sentences:
                continue
            yield index, {
                "token_ids": np.concatenate(sentences),
                "sentence_lengths": np.array([len(s) for s in sentences], np.int32),
                "doc_index": index,
            }


def cache_key(files: list[pathlib.Path], tokenizer_path: str | pathlib.Path) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.absolute()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    for f in tokenizer_files(tokenizer_path):  # a byte-level BPE is two files (vocab.json, merges.txt)
        h.update(f.read_bytes())
    h.update(f"eval_every={EVAL_EVERY}|{TextCorpus.VERSION}".encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("BERTOLOGY_CACHE", "~/.cache/bertology")).expanduser() / "tfds"


def load_documents(
    corpus: str | pathlib.Path,
    tokenizer: Tokenizer,
    tokenizer_path: str | pathlib.Path,
    cache_dir: str | pathlib.Path | None = None,
    log=print,
) -> dict[str, list[Document]]:
    """{'train': docs, 'validation': docs}, each doc a list of per-sentence id arrays, in corpus order."""
    files = corpus_files(corpus)
    if all(f.stat().st_size == 0 for f in files):
        raise UserError(f"corpus {corpus} is empty; it needs text, one sentence per line")
    data_dir = pathlib.Path(cache_dir or default_cache_dir()) / cache_key(files, tokenizer_path)
    builder = TextCorpus(files=files, tokenizer=tokenizer, data_dir=str(data_dir), file_format="array_record")
    if not builder.is_prepared():
        stray = check_text(files)
        if stray:
            log(f"corpus {corpus}: replaced {stray} NUL or invalid UTF-8 sequence(s) (under {NOT_TEXT_FRACTION:.0%} "
                "of the text, so kept as text)")
        log(f"tokenizing corpus {corpus} into {data_dir} (once; later runs reuse it)")
        tfds.disable_progress_bar()
        builder.download_and_prepare()
    out = {}
    for split in ("train", "validation"):
        source = builder.as_data_source(split=split)
        records = sorted((source[i] for i in range(len(source))), key=lambda r: int(r["doc_index"]))
        out[split] = [np.split(r["token_ids"], np.cumsum(r["sentence_lengths"])[:-1]) for r in records]
    return out
