"""The embedded stdlib-docstring corpus and the shipped default vocab."""

from __future__ import annotations

import inspect
import re
import sys

import pytest

from bertology.data import embedded
from bertology.data.tokenizers import WordPieceTokenizer, load_tokenizer
from bertology.data.tokenizers.wordpiece import SPECIAL_TOKENS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(path, text) of a corpus built in a private cache directory, never the user's home."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_CACHE", str(cache))
        path = embedded.embedded_corpus_path()
    return path, path.read_text(encoding="utf-8")


def test_corpus_is_cached_under_bertology_cache(corpus, monkeypatch):
    path, _ = corpus
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    assert path.name == f"stdlib_docstrings_py{version}.txt" and path.parent.name == "embedded"
    assert not list(path.parent.glob("*.tmp"))
    monkeypatch.setenv("BERTOLOGY_CACHE", str(path.parent.parent))
    before = path.stat().st_mtime_ns
    assert embedded.embedded_corpus_path() == path and path.stat().st_mtime_ns == before


def test_corpus_build_is_deterministic(corpus, tmp_path, monkeypatch):
    """A second build parses the standard library again (not this process's memory of the first)
    and writes the same bytes, and the parsed sentences' cache beside it."""
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path))
    embedded.stdlib_sentences.cache_clear()
    rebuilt = embedded.embedded_corpus_path()
    assert rebuilt != corpus[0] and rebuilt.read_bytes() == corpus[0].read_bytes()
    assert list(rebuilt.parent.glob("stdlib_sentences_py*.json"))


def test_corpus_format(corpus):
    _, text = corpus
    assert 800_000 < len(text) < 3_000_000
    assert text.endswith("\n") and not text.startswith("\n") and "\n\n\n" not in text
    documents = text[:-1].split("\n\n")
    assert len(documents) > 200
    assert all(len(doc.split("\n")) >= 2 for doc in documents)
    lines = [line for doc in documents for line in doc.split("\n")]
    assert all(line == line.strip() and " " in line and len(line) <= 2000 for line in lines)
    assert not any(">>>" in line or line.startswith("...") for line in lines)
    # Mostly real sentences: capitalised and closed by punctuation.
    assert sum(bool(re.match(r"[A-Z].*[.!?:)]$", line)) for line in lines) > 0.7 * len(lines)
    assert "JSON (JavaScript Object Notation)" in text


def test_docstring_cleaning():
    doc = """Frobnicate the widget.  It is wrapped
    over two lines! Then more.

    Example::

        widget.frobnicate(3)
        print(widget)

    >>> frobnicate(2)
    4

    x = compute(1)
    The :func:`frob` helper and ``literal`` text.
    """
    assert embedded.docstring_sentences(inspect.cleandoc(doc)) == [
        "Frobnicate the widget.",
        "It is wrapped over two lines!",
        "Then more.",
        "The frob helper and literal text.",
    ]


def test_default_vocab():
    tokens = embedded.DEFAULT_VOCAB.read_text(encoding="utf-8").split("\n")
    assert tokens[-1] == "" and len(tokens[:-1]) == 8192 == len(set(tokens[:-1]))
    assert tokens[:5] == list(SPECIAL_TOKENS)
    tok = load_tokenizer(embedded.DEFAULT_VOCAB)
    assert isinstance(tok, WordPieceTokenizer) and tok.basic.do_lower_case


def test_default_vocab_rarely_unknown_on_the_corpus(corpus):
    tok = WordPieceTokenizer(embedded.DEFAULT_VOCAB)
    ids = [i for line in corpus[1].splitlines() for i in tok.encode(line)]
    assert len(ids) > 200_000
    assert ids.count(tok.unk_id) < 0.005 * len(ids)
