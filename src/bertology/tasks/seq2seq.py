"""Source -> target tasks for encoder-decoder fine-tuning, read from the files as released.

Every example is {"idx", "source", "target"}; the task kind is `seq2seq` (teacher-forced
training, evaluation by generation scored with ROUGE and BLEU, `evaluation.generation`).

- `seq2seq_jsonl`: `data.dir` holds `train.jsonl`, `validation.jsonl` (and optionally
  `test.jsonl`), one `{"source": ..., "target": ...}` object per line.
- `cnndm` (CNN/DailyMail 3.0.0, Hermann et al. 2015; See et al. 2017's non-anonymised version):
  either the Hugging Face / TFDS release, `{train,validation,test}.csv` (columns id, article,
  highlights; Kaggle's copy) or `.jsonl` with the same keys, highlights one per line; or the
  original `.story` files (`cnn/stories/`, `dailymail/stories/`, or `stories/`) with the split
  lists `url_lists/all_{train,val,test}.txt`, a story's file name being the SHA-1 of its URL.
  A story's article is its lines before the first `@highlight`, the highlights the line after
  each `@highlight`; a line without final punctuation gets " ." as in the TFDS builder.
- `xsum` (Narayan et al. 2018): the Hugging Face release `{train,validation,test}.jsonl` with
  `document` / `summary`, or the original `bbc-summary-data/<id>.summary` files, whose
  `[SN]FIRST-SENTENCE[SN]` section is the summary and `[SN]RESTBODY[SN]` the document, split by
  `XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json`.
- `seq2seq_embedded` (no download): a standard-library docstring's body -> its first sentence,
  the docstring's own summary line; docstrings of 2 to 8 prose sentences, thinned evenly to
  `MAX_PAIRS`; every 10th pair goes to validation and the one after it to test.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import inspect
import json
import pathlib
import sys
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from bertology.data import embedded as corpus
from bertology.errors import UserError
from bertology.evaluation import generation as metrics
from bertology.tasks import Example, Task, builder, data_dir

FEATURES = {"idx": np.int64, "source": tfds.features.Text(), "target": tfds.features.Text()}
SPLITS = ("train", "validation", "test")
MAX_PAIRS = 4000
END_TOKENS = (".", "!", "?", "...", "'", "`", '"', "\u2019", "\u201d", ")")  # the TFDS builder's list


def _score(examples: list[Example], predictions: list[str]) -> dict[str, float]:
    return metrics.score(list(predictions), [e["target"] for e in examples])


def _load(name: str, find, directory: str | None, cache_dir=None, log=print) -> builder.Splits:
    """`find(directory)` -> ({split: parser}, the files read); splits without a file are left out."""
    parsers, files = find(data_dir(directory, name))
    return builder.load(name, FEATURES, parsers, files, cache_dir, log)


def _require(path: pathlib.Path, what: str) -> pathlib.Path:
    if not path.is_file():
        raise UserError(f"{what}: expected {path}; set data.dir to the directory of the release")
    return path


def _records(path: pathlib.Path, read: builder.Read, source_key: str, target_key: str) -> Iterator[Example]:
    """Examples from a JSONL or CSV file of the given columns; rows missing either are skipped."""
    read.source = str(path)
    if path.suffix == ".csv":
        csv.field_size_limit(sys.maxsize)  # CNN/DailyMail articles exceed csv's default 128 KiB field limit
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    read.skip("not JSON")
    for row in rows:
        source, target = row.get(source_key), row.get(target_key)
        if not isinstance(source, str) or not isinstance(target, str) or not source.strip() or not target.strip():
            read.skip(f"no {source_key} or {target_key}")
            continue
        yield {"idx": read.kept, "source": source, "target": target}
        read.kept += 1


def _table_files(directory: pathlib.Path, name: str, source_key: str, target_key: str, suffixes: tuple[str, ...]):
    """Per-split parsers of `<split>.<suffix>` files (train and validation required)."""
    parsers, files = {}, []
    for split in SPLITS:
        found = [directory / f"{split}{s}" for s in suffixes if (directory / f"{split}{s}").is_file()]
        if not found:
            if split != "test":
                _require(directory / f"{split}{suffixes[0]}", f"{name} {split} split")
            continue
        files.append(found[0])
        parsers[split] = functools.partial(lambda p, read: _records(p, read, source_key, target_key), found[0])
    return parsers, files


# ---- CNN/DailyMail .story files ----

def story_url_hash(url: str) -> str:
    """The file name stem of a story: the hex SHA-1 of its URL (the release's convention)."""
    return hashlib.sha1(url.strip().encode("utf-8")).hexdigest()


def _fix_missing_period(line: str) -> str:
    if "@highlight" in line or not line or line.endswith(END_TOKENS):
        return line
    return line + " ."


def parse_story(text: str) -> tuple[str, str]:
    """(article, highlights one per line) of one `.story` file."""
    lines = [_fix_missing_period(line.strip()) for line in text.splitlines()]
    article, highlights, next_is_highlight = [], [], False
    for line in lines:
        if not line:
            continue
        if line.startswith("@highlight"):
            next_is_highlight = True
        elif next_is_highlight:
            highlights.append(line)
        else:
            article.append(line)
    return " ".join(article), "\n".join(highlights)


def _story_files(directory: pathlib.Path):
    roots = [d for d in (directory / "cnn" / "stories", directory / "dailymail" / "stories", directory / "stories")
             if d.is_dir()]
    stories = {p.stem: p for root in roots for p in root.glob("*.story")}
    parsers, files = {}, []
    for split, list_name in zip(SPLITS, ("all_train.txt", "all_val.txt", "all_test.txt")):
        urls = _require(directory / "url_lists" / list_name, f"cnndm {split} split list")
        files.append(urls)

        def parse(read: builder.Read, urls: pathlib.Path = urls) -> Iterator[Example]:
            read.source = str(urls)
            for url in urls.read_text(encoding="utf-8").split():
                path = stories.get(story_url_hash(url))
                if path is None:
                    read.skip("story file missing")
                    continue
                article, highlights = parse_story(path.read_text(encoding="utf-8"))
                if not article or not highlights:
                    read.skip("no article or no highlights")
                    continue
                yield {"idx": read.kept, "source": article, "target": highlights}
                read.kept += 1

        parsers[split] = parse
    return parsers, files + sorted(stories.values())


def _find_cnndm(directory: pathlib.Path):
    if (directory / "url_lists").is_dir():
        return _story_files(directory)
    return _table_files(directory, "cnndm", "article", "highlights", (".csv", ".jsonl"))


# ---- XSum .summary files ----

def parse_summary_file(text: str) -> dict[str, str]:
    """The `[SN]NAME[SN]` sections of one XSum `.summary` file, each its lines joined by newlines."""
    sections, name = {}, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[SN]") and stripped.endswith("[SN]") and len(stripped) > 8:
            name = stripped[4:-4]
            sections[name] = []
        elif name is not None and stripped:
            sections[name].append(stripped)
    return {k: "\n".join(v) for k, v in sections.items()}


def _find_xsum(directory: pathlib.Path):
    split_file = directory / "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json"
    if not split_file.is_file():
        return _table_files(directory, "xsum", "document", "summary", (".jsonl",))
    ids = json.loads(split_file.read_text(encoding="utf-8"))
    root = directory / "bbc-summary-data" if (directory / "bbc-summary-data").is_dir() else directory
    parsers = {}
    for split in SPLITS:
        if split not in ids:
            raise UserError(f"{split_file} has no {split!r} list; it is not XSum's split file")

        def parse(read: builder.Read, split: str = split) -> Iterator[Example]:
            read.source = str(root)
            for i in ids[split]:
                path = root / f"{i}.summary"
                if not path.is_file():
                    read.skip("summary file missing")
                    continue
                sections = parse_summary_file(path.read_text(encoding="utf-8"))
                document, summary = sections.get("RESTBODY", ""), sections.get("FIRST-SENTENCE", "")
                if not document or not summary:
                    read.skip("no RESTBODY or no FIRST-SENTENCE")
                    continue
                yield {"idx": read.kept, "source": document, "target": summary}
                read.kept += 1

        parsers[split] = parse
    return parsers, [split_file, *sorted(root.glob("*.summary"))]


# ---- the embedded task ----

@functools.lru_cache(maxsize=1)
def docstring_pairs() -> tuple[tuple[str, str], ...]:
    """(body, first sentence) of every standard-library docstring of 2 to 8 prose sentences,
    repeated docstrings once, in source order, thinned evenly to MAX_PAIRS."""
    pairs = []
    docs = (doc for source in corpus.stdlib_sources(corpus.stdlib_root()) for doc in corpus.module_docstrings(source))
    for doc in dict.fromkeys(docs):
        sentences = corpus.docstring_sentences(inspect.cleandoc(doc))
        if 2 <= len(sentences) <= 8:
            pairs.append((" ".join(sentences[1:]), sentences[0]))
    keep = np.unique(np.linspace(0, len(pairs) - 1, min(MAX_PAIRS, len(pairs))).round().astype(int))
    return tuple(pairs[i] for i in keep)


def _find_embedded(directory: pathlib.Path):
    del directory  # built from the installed standard library

    def parse(split: str, read: builder.Read) -> Iterator[Example]:
        read.source = str(corpus.stdlib_root())
        for i, (body, first) in enumerate(docstring_pairs()):
            if {8: "validation", 9: "test"}.get(i % 10, "train") == split:
                yield {"idx": read.kept, "source": body, "target": first}
                read.kept += 1

    return {s: functools.partial(parse, s) for s in SPLITS}, corpus.stdlib_sources(corpus.stdlib_root())


def _task(name: str, find) -> Task:
    return Task(name=name, kind="seq2seq", labels=(), primary="rougeL", load=functools.partial(_load, name, find),
                score=_score)


TASKS = {
    "seq2seq_jsonl": _task("seq2seq_jsonl", lambda d: _table_files(d, "seq2seq_jsonl", "source", "target", (".jsonl",))),
    "cnndm": _task("cnndm", _find_cnndm),
    "xsum": _task("xsum", _find_xsum),
    "seq2seq_embedded": _task("seq2seq_embedded", _find_embedded),
}
