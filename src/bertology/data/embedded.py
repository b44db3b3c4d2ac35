"""The embedded default corpus: English docstrings of the installed Python standard library.

Every Python install carries well over a megabyte of carefully written English prose in its
standard library docstrings, so pretraining and the tests can run with no download at all. The
text is written in the original BERT pretraining format -- one sentence per line, a blank line
between documents -- with one document per module (its module, class and function docstrings in
source order). Sources are parsed with `ast`, never imported, so building has no side effects.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import pathlib
import re
import sys
import sysconfig
import warnings

from bertology.files import atomic_write

DEFAULT_VOCAB: pathlib.Path = pathlib.Path(__file__).parent / "assets" / "wordpiece_uncased_8k.txt"
# An 8192-token GPT-2-style byte-level BPE (vocab.json + merges.txt) trained on the same corpus.
BYTE_BPE_VOCAB: pathlib.Path = pathlib.Path(__file__).parent / "assets" / "bytebpe_8k"
# Multi-word phrases and names common in the docstrings, for ERNIE-style entity/phrase masking.
DEFAULT_LEXICON: pathlib.Path = pathlib.Path(__file__).parent / "assets" / "stdlib_phrases.txt"
# Named things of the docstrings, for ERNIE's entity stage: the dotted standard-library names that
# occur at least 3 times (sys.path, os.environ, concurrent.futures.Future, ...) and a few proper
# names (Mac OS, Document Object Model, ...); one-token names need no lexicon.
ENTITY_LEXICON: pathlib.Path = pathlib.Path(__file__).parent / "assets" / "stdlib_entities.txt"
# The shipped lists by the names data.lexicon may give instead of a file.
LEXICONS: dict[str, pathlib.Path] = {"phrases": DEFAULT_LEXICON, "entities": ENTITY_LEXICON}

# Test suites, GUI demos, vendored or generated code: little prose, much noise.
_SKIP_DIRS = frozenset(
    {
        "site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
        "ensurepip", "venv", "__pycache__", "pydoc_data", "lib-dynload", "__phello__",
    }
)
_DOCTEST = re.compile(r"^(>>>|\.\.\.)")
_DIRECTIVE = re.compile(r"^\.\.\s")
_UNDERLINE = re.compile(r"^([=\-~^*#+_])\1{2,}$")
# A list item, a field ("name: text", "name -- text") or a table row ("name   text").
_BULLET = re.compile(r"^([-*+\u2022]\s|\d+[.)]\s|\w[\w.*]*\s*(--|:)\s|\S+\s{2,}\S)")
_CODE = re.compile(
    r"^(def |class \w+\s*[(:]|import [\w.]+$|from \S+ import |try:|except\b.*:$|finally:|else:$"
    r"|elif .*:$|if .*:$|for .*:$|while .*:$|with .*:$|@\w|#)"
    r"|^[\w.]+(\[.*\])?\s*[-+*/|&]?=\s*\S"  # assignment
    r"|^[\w.]+\([^()]*\)(\s*(-+>|=>).*)?$|^[\w.]+\(.*\)\s*(-+>|=>)"  # a call or signature line
    r"|==|!=|->|\+=|;$|[{}]|\blambda\b"
)
_ROLE = re.compile(r":[\w:.+-]+:`~?!?([^`<]*?)(\s*<[^`]*>)?`")
_LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`_?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])|(?<=[.!?][\"')\]])\s+(?=[A-Z])")
_MAX_SENTENCE_CHARS = 1000


def embedded_corpus_path() -> pathlib.Path:
    """Build the corpus on first use and return its cached path.

    The file is keyed by the Python version because the docstrings change between releases;
    it is written to a temporary file and renamed so a crashed or concurrent build never leaves a
    truncated corpus behind.
    """
    path = _cache_dir() / "embedded" / f"stdlib_docstrings_py{_version()}.txt"
    if not path.exists():
        atomic_write(path, build_corpus_text().encode("utf-8"))
    return path


def build_corpus_text() -> str:
    """Return the whole corpus as one string (deterministic for a given Python install)."""
    documents = ["\n".join(sentences) for sentences in stdlib_sentences().values() if len(sentences) >= 2]
    return "\n\n".join(documents) + "\n"


@functools.lru_cache(maxsize=1)
def stdlib_sentences() -> dict[str, list[str]]:
    """{each stdlib module's path, relative to the stdlib: its `module_sentences`}, in
    `stdlib_sources` order: what the corpus, the embedded task's labels and the entity graph are
    made of. Parsing the standard library costs about 3 CPU-seconds, which every process that
    imported the task registry paid before this was cached (as JSON, beside the corpus, written
    the same atomic way); reading the cache takes milliseconds."""
    path = _cache_dir() / "embedded" / f"stdlib_sentences_py{_version()}.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    root = stdlib_root()
    sentences = {source.relative_to(root).as_posix(): module_sentences(source) for source in stdlib_sources(root)}
    atomic_write(path, json.dumps(sentences).encode("utf-8"))
    return sentences


def stdlib_root() -> pathlib.Path:
    """Where the installed standard library's sources are."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _version() -> str:
    return f"{sys.version_info.major}{sys.version_info.minor}"


def _cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("BERTOLOGY_CACHE", "~/.cache/bertology")).expanduser()


def stdlib_sources(root: pathlib.Path) -> list[pathlib.Path]:
    """All .py files under `root` outside the skipped trees, sorted by relative path."""
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        found += [pathlib.Path(directory, f) for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def module_docstrings(source: pathlib.Path) -> list[str]:
    """Every docstring of one module (the module's, its classes' and functions'), in source
    order, as written (uncleaned), repeated ones once; none for a file that does not parse."""
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences in old modules
            warnings.simplefilter("ignore")
            tree = ast.parse(source.read_bytes())
    except (SyntaxError, ValueError):  # a stray Python 2 file or a bad encoding cookie
        return []
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = [n for n in ast.walk(tree) if isinstance(n, kinds)]
    nodes.sort(key=lambda n: (n.lineno, n.col_offset))
    docs = (ast.get_docstring(node, clean=False) for node in [tree, *nodes])
    return list(dict.fromkeys(doc for doc in docs if doc))


def module_sentences(source: pathlib.Path) -> list[str]:
    """Sentences of every docstring in one module, in source order, repeated docstrings once."""
    return [sentence for doc in module_docstrings(source) for sentence in docstring_sentences(inspect.cleandoc(doc))]


def docstring_sentences(doc: str) -> list[str]:
    """The prose sentences of one cleaned docstring (`inspect.cleandoc`), code and lists left out."""
    sentences = []
    for paragraph in _paragraphs(doc):
        text = _LITERAL.sub(lambda m: m.group(1) or m.group(2), _ROLE.sub(r"\1", paragraph))
        for sentence in _SENTENCE_END.split(" ".join(text.split())):
            if _is_prose(sentence):
                sentences.append(sentence)
    return sentences


def _paragraphs(doc: str) -> list[str]:
    """Prose paragraphs of a cleaned docstring, with doctests, literal blocks and code dropped.

    A paragraph ends at a blank line, a dedent, a list item, or a heading underline; wrapped lines
    inside it are joined with spaces.
    """
    paragraphs: list[list[str]] = [[]]
    skip_deeper_than: int | None = None  # inside a reST literal block or directive body
    in_doctest = False
    previous_indent = 0
    for raw in doc.splitlines():
        line = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if not line:
            in_doctest = False
            paragraphs.append([])
            continue
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue
        skip_deeper_than = None
        if _DOCTEST.match(line) or in_doctest:
            in_doctest = True  # the lines after a prompt, up to a blank line, are its output
            continue
        if _DIRECTIVE.match(line) or line.endswith("::"):
            skip_deeper_than = indent
            paragraphs.append([])
            if _DIRECTIVE.match(line):
                continue
            line = line[:-1]
        if _UNDERLINE.match(line) or _CODE.search(line):
            paragraphs.append([])
            continue
        if paragraphs[-1] and (indent < previous_indent or _BULLET.match(line)):
            paragraphs.append([])
        paragraphs[-1].append(line)
        previous_indent = indent
    return [" ".join(p) for p in paragraphs if p]


def _is_prose(sentence: str) -> bool:
    """At least two words, not too long, and mostly letters and spaces (not a table or a path)."""
    if len(sentence) > _MAX_SENTENCE_CHARS or " " not in sentence:
        return False
    wordy = sum(c.isalpha() or c == " " for c in sentence)
    return wordy >= 0.75 * len(sentence)
