"""`COMMAND --help` of a command that takes a config: every key with its value and the comment
that documents it where the key is defined.

The recipes document their keys with comments (`text_column="text",  # ...` inside a
`ConfigDict(...)` or `.update(...)` call, `c.seed = 0  # ...`, or comment lines right above such a
line). Those comments are the documentation, so this reads them from the source rather than keep a
second copy that would drift. Only the functions that ran while the config was built are read
(`documented` records them), so a key gets its own recipe's comment, not that of a key of the same
name in another command's config (pretraining's `total_steps` is not fine-tuning's). A key is
looked up by its dotted path (`data.text_column`), failing that by its last parts: helpers such as
`mesh_config()` build a block without knowing the name it is stored under.
"""

from __future__ import annotations

import ast
import functools
import io
import pathlib
import sys
import tokenize
from types import CodeType, FrameType
from typing import Any, Callable, Iterator, TypeVar

import ml_collections

T = TypeVar("T")
_PACKAGE = pathlib.Path(__file__).resolve().parent


def documented(build: Callable[[], T], config_file: str | None = None) -> tuple[T, dict[str, str]]:
    """`build()` and the comments of the config keys that the functions it called define ({dotted
    key: comment}). Read from this package's functions and from `config_file`'s; where two define
    the same key, the one called later (the recipe a preset calls, not the preset) wins."""
    called: dict[CodeType, None] = {}

    def record(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            called.setdefault(frame.f_code)

    previous = sys.getprofile()
    sys.setprofile(record)
    try:
        result = build()
    finally:
        sys.setprofile(previous)
    config_path = pathlib.Path(config_file).resolve() if config_file else None
    read = {name: path for name in {code.co_filename for code in called} if name.endswith(".py")
            for path in [pathlib.Path(name).resolve()] if path == config_path or _PACKAGE in path.parents}
    docs: dict[str, str] = {}
    for code in called:
        if code.co_filename in read:
            docs.update(_key_docs(str(read[code.co_filename])).get(code.co_firstlineno, {}))
    return result, docs


def describe(config: ml_collections.ConfigDict, docs: dict[str, str]) -> str:
    """`key (value): comment` for every key of `config`, the top-level ones first, then one group
    per block (model, data, optimizer, ...)."""
    groups: dict[str, list[str]] = {}
    for key, value in _flat(config.to_dict()):
        block = key.partition(".")[0] if "." in key else ""
        doc = _lookup(docs, key)
        shown = repr(value) if isinstance(value, str) else str(value)
        groups.setdefault(block, []).append(f"  {key} ({shown})" + (f": {doc}" if doc else ""))
    lines = ["config keys (override one with --config.KEY=VALUE):"]
    for block, keys in sorted(groups.items(), key=lambda group: group[0] != ""):
        if block:
            lines.append(f"{block}:" + (f" {docs[block]}" if block in docs else ""))
        lines.extend(keys)
    return "\n".join(lines)


def _flat(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _lookup(docs: dict[str, str], key: str) -> str | None:
    parts = key.split(".")
    return next((docs[k] for k in (".".join(parts[i:]) for i in range(len(parts))) if k in docs), None)


@functools.lru_cache(maxsize=None)
def _key_docs(path: str) -> dict[int, dict[str, str]]:
    """{a function's first line (as its code object's `co_firstlineno`): {key: comment}} of a file."""
    source = pathlib.Path(path).read_text(encoding="utf-8")
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whether the comment is the whole line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip(), token.line.lstrip().startswith("#")
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[first] = _comments(list(_keys(node)), comments)
    return found


def _comments(keys: list[tuple[str, int, int]], comments: dict[int, tuple[str, bool]]) -> dict[str, str]:
    """A key's comment: the one ending its line, else the comment lines right above it. Where several
    keys share a line (`files=ConfigDict(dict(train=..., test=...)),  # ...`), the first, outermost
    one (`_keys` yields a block before its keys) has it."""
    ending: dict[int, str] = {}
    starting: dict[int, str] = {}
    for key, start, end in keys:
        ending.setdefault(end, key)
        starting.setdefault(start, key)
    docs = {}
    for key, start, end in keys:
        text, whole_line = comments.get(end, ("", True))
        above: list[str] = []
        while comments.get(start - 1 - len(above), ("", False))[1]:
            above.insert(0, comments[start - 1 - len(above)][0])
        if not whole_line and ending[end] == key:
            docs[key] = text
        elif above and starting[start] == key:
            docs[key] = " ".join(above)
    return docs


def _keys(function: ast.AST) -> Iterator[tuple[str, int, int]]:
    """(dotted key, first line, last line) of each config key `function` sets: `c.a.b = v`, keywords
    of `ConfigDict(...)` / `ConfigDict(dict(...))` / `ConfigDict({...})` and of `c.a.update(...)`.
    A ConfigDict not stored under a key (returned, or in a local variable) gives paths relative to
    where it ends up."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            path = _attribute_path(node.targets[0])
            if path:
                yield path, node.lineno, node.end_lineno or node.lineno
            yield from _config_dict_keys(node.value, f"{path}." if path else "")
        elif isinstance(node, ast.Return) and node.value is not None:
            yield from _config_dict_keys(node.value, "")
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "update"):
            path = _attribute_path(node.value.func.value)
            yield from _entries(node.value.keywords, [], f"{path}." if path else "")


def _attribute_path(node: ast.expr) -> str:
    """`c.data.corpus` -> "data.corpus" (the root variable dropped); "" for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return ".".join(parts) if isinstance(node, ast.Name) else ""


def _config_dict_keys(node: ast.expr, prefix: str) -> Iterator[tuple[str, int, int]]:
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "ConfigDict"):
        return
    yield from _entries(node.keywords, [], prefix)
    for arg in node.args:
        if isinstance(arg, ast.Call) and getattr(arg.func, "id", None) == "dict":
            yield from _entries(arg.keywords, [], prefix)
        elif isinstance(arg, ast.Dict):
            yield from _entries([], [(k, v) for k, v in zip(arg.keys, arg.values)
                                     if isinstance(k, ast.Constant) and isinstance(k.value, str)], prefix)


def _entries(keywords: list[ast.keyword], items: list[tuple[Any, ast.expr]], prefix: str) -> Iterator[tuple[str, int, int]]:
    """The keys of `k=v` keywords and `"k": v` dict items, nested ConfigDicts included."""
    for name, start, value in [*((k.arg, k.lineno, k.value) for k in keywords if k.arg),
                               *((k.value, k.lineno, v) for k, v in items)]:
        yield f"{prefix}{name}", start, value.end_lineno or value.lineno
        yield from _config_dict_keys(value, f"{prefix}{name}.")
