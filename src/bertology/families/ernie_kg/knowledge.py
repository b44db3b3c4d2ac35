"""The knowledge graph ERNIE (Tsinghua) reads: entities, their TransE vectors, and the mentions
that align them to text, read from files; and the small graph built from the embedded corpus.

A knowledge-graph directory (`data.kg`) holds three UTF-8 text files, the first two in the layout
of thunlp/ERNIE's `kg_embed` (OpenKE's output):

- `entity2id.txt`: the number of entities n on the first line, then n lines `name<TAB>id`, the
  ids 0 ... n-1 each once;
- `entity2vec.vec`: n lines, line i the vector of entity i as d tab-separated floats (the frozen
  TransE embeddings; every line the same d, which must equal `model.entity_size`);
- `mentions.txt`: lines `surface text<TAB>entity name`: the text by which an entity is mentioned
  (several lines may name one entity). This is the entity-annotated text's index: the reference
  turns Wikipedia anchors into entity ids through `anchor2id.txt` the same way, and our data
  pipeline hands the transform token ids, not characters, so a mention is found by its tokens
  (`MentionMatcher`), and the entity is aligned to the mention's first token, as the reference's
  `create_instances.py` keeps an entity id on the first token of its anchor only.

`data.kg="embedded"` (the default) builds, once, a graph of the standard library the embedded
corpus documents (`embedded_graph`): its modules, classes and functions are the entities, "defined
in" (a class or function in its module, a module in its package) and "mentions" (a module's
docstrings name the entity) the relations, each entity mentioned by its dotted name (and a class
by a CamelCase name that names one class only), and `transe` trains the vectors in seconds. It
also writes OpenKE's `relation2id.txt` and `train2id.txt` (the triples) beside them.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import pathlib
import re

import numpy as np

from bertology.data import embedded
from bertology.data.lexicon import index_entries, longest_matches
from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError
from bertology.files import atomic_write

ENTITY_DIM = 100  # the embedded graph's vector width: the paper's (TransE on Wikidata, d = 100)
RELATIONS = ("defined_in", "mentions")
FILES = ("entity2id.txt", "entity2vec.vec", "mentions.txt")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_CAMEL = re.compile(r"[A-Z][a-z0-9]+[A-Z]\w*")


@dataclasses.dataclass(frozen=True)
class Graph:
    """A knowledge graph as the model reads it: entity names (id = index), their vectors
    [n, d] float32, and the mentions (surface text, entity id)."""

    names: tuple[str, ...]
    vectors: np.ndarray
    mentions: tuple[tuple[str, int], ...]


def _lines(path: pathlib.Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"knowledge graph file not found: {path}; a data.kg directory holds {', '.join(FILES)} "
                        "(families/ernie_kg/knowledge.py)")
    return path.read_text(encoding="utf-8").splitlines()


def read_graph(directory: str | pathlib.Path) -> Graph:
    """The graph in `directory` (the module docstring's files); a malformed line stops with one
    line naming the file, the line number and what it should be."""
    directory = pathlib.Path(directory)
    ids_path, vec_path, mention_path = (directory / f for f in FILES)
    lines = _lines(ids_path)
    if not lines or not lines[0].strip().isdigit():
        raise UserError(f"{ids_path}:1: the first line must be the number of entities")
    n = int(lines[0])
    if len(lines) - 1 != n:
        raise UserError(f"{ids_path}: the first line says {n} entities but {len(lines) - 1} lines follow")
    names: list[str | None] = [None] * n
    for k, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 2 or not parts[1].strip().isdigit() or not 0 <= int(parts[1]) < n or not parts[0]:
            raise UserError(f"{ids_path}:{k}: expected 'name<TAB>id' with an id in 0..{n - 1}, got {line!r}")
        if names[int(parts[1])] is not None:
            raise UserError(f"{ids_path}:{k}: id {parts[1]} is given twice")
        names[int(parts[1])] = parts[0]
    vec_lines = _lines(vec_path)
    if len(vec_lines) != n:
        raise UserError(f"{vec_path}: {len(vec_lines)} vectors for {n} entities; line i is entity i's vector")
    rows = []
    for k, line in enumerate(vec_lines, start=1):
        try:
            rows.append([float(x) for x in line.split("\t")])
        except ValueError:
            raise UserError(f"{vec_path}:{k}: expected tab-separated floats, got {line[:60]!r}") from None
        if len(rows[-1]) != len(rows[0]):
            raise UserError(f"{vec_path}:{k}: {len(rows[-1])} numbers where line 1 has {len(rows[0])}")
    index = {name: i for i, name in enumerate(names)}
    mentions = []
    for k, line in enumerate(_lines(mention_path), start=1):
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip():
            raise UserError(f"{mention_path}:{k}: expected 'surface text<TAB>entity name', got {line!r}")
        if parts[1] not in index:
            raise UserError(f"{mention_path}:{k}: entity {parts[1]!r} is not in {ids_path.name}")
        mentions.append((parts[0], index[parts[1]]))
    return Graph(tuple(str(name) for name in names), np.asarray(rows, np.float32).reshape(n, -1),
                 tuple(mentions))


def vector_width(directory: str | pathlib.Path) -> int:
    """d of a graph's `entity2vec.vec` (its first line), without reading the rest."""
    path = pathlib.Path(directory) / FILES[1]
    with open(path, encoding="utf-8") as f:
        return len(f.readline().split("\t"))


def write_graph(directory: pathlib.Path, names: list[str], vectors: np.ndarray,
                mentions: list[tuple[str, int]], triples: np.ndarray) -> None:
    """The files of `read_graph` (and OpenKE's relation2id.txt and train2id.txt), each written atomically."""
    files = {
        "entity2id.txt": f"{len(names)}\n" + "".join(f"{name}\t{i}\n" for i, name in enumerate(names)),
        "entity2vec.vec": "".join("\t".join(f"{x:.6f}" for x in row) + "\n" for row in vectors),
        "mentions.txt": "".join(f"{text}\t{names[e]}\n" for text, e in mentions),
        "relation2id.txt": f"{len(RELATIONS)}\n" + "".join(f"{r}\t{i}\n" for i, r in enumerate(RELATIONS)),
        "train2id.txt": f"{len(triples)}\n" + "".join(f"{h} {t} {r}\n" for h, t, r in triples),
    }
    for name, text in files.items():
        atomic_write(directory / name, text.encode("utf-8"))


def transe(triples: np.ndarray, entities: int, relations: int, *, dim: int = ENTITY_DIM, epochs: int = 100,
           margin: float = 1.0, learning_rate: float = 0.05, seed: int = 0) -> np.ndarray:
    """TransE (Bordes et al. 2013): h + r ≈ t under the L2 distance, trained with the margin loss
    max(0, margin + d(h + r, t) − d(h' + r, t')) against one corrupted triple per triple (head or
    tail replaced by a uniform entity), full-batch gradient steps, entity vectors renormalised to
    unit length before each epoch as the paper does. `triples` [n, 3] are (head, tail, relation),
    OpenKE's order. Deterministic for a seed; the entity vectors [entities, dim] float32."""
    rng = np.random.default_rng(seed)
    bound = 6 / np.sqrt(dim)
    ent = rng.uniform(-bound, bound, (entities, dim))
    rel = rng.uniform(-bound, bound, (relations, dim))
    rel /= np.linalg.norm(rel, axis=1, keepdims=True)
    h, t, r = triples[:, 0], triples[:, 1], triples[:, 2]
    for _ in range(epochs):
        ent /= np.maximum(np.linalg.norm(ent, axis=1, keepdims=True), 1e-12)
        corrupt_head = rng.random(len(triples)) < 0.5
        other = rng.integers(0, entities, len(triples))
        h2, t2 = np.where(corrupt_head, other, h), np.where(corrupt_head, t, other)
        good, bad = ent[h] + rel[r] - ent[t], ent[h2] + rel[r] - ent[t2]
        dg, db = np.linalg.norm(good, axis=1), np.linalg.norm(bad, axis=1)
        active = (margin + dg - db) > 0
        gg = np.where(active[:, None], good / np.maximum(dg, 1e-12)[:, None], 0.0)
        gb = np.where(active[:, None], bad / np.maximum(db, 1e-12)[:, None], 0.0)
        grad_ent, grad_rel = np.zeros_like(ent), np.zeros_like(rel)
        np.add.at(grad_ent, h, gg)
        np.add.at(grad_ent, t, -gg)
        np.add.at(grad_ent, h2, -gb)
        np.add.at(grad_ent, t2, gb)
        np.add.at(grad_rel, r, gg - gb)
        ent -= learning_rate * grad_ent
        rel -= learning_rate * grad_rel
    return ent.astype(np.float32)


def _module_name(source: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(source.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stdlib_graph(sources: list[pathlib.Path]) -> tuple[list[str], list[tuple[str, int]], np.ndarray]:
    """(entity names, mentions, triples) of these standard-library sources (`embedded.stdlib_sources`,
    or some of them): every module and its public top-level classes and functions that the
    docstrings name (see the module docstring)."""
    root, sentences = embedded.stdlib_root(), embedded.stdlib_sentences()
    modules, members, texts = [], [], {}
    for source in sources:
        try:
            tree = ast.parse(source.read_bytes())
        except (SyntaxError, ValueError):
            continue
        module = _module_name(source, root)
        modules.append(module)
        members += [f"{module}.{node.name}" for node in tree.body
                    if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")]
        texts[module] = " ".join(sentences[source.relative_to(root).as_posix()])
    named = {m: set(_NAME.findall(text)) for m, text in texts.items()}
    said = set().union(*named.values())
    names = sorted(set(modules) | {m for m in members if m in said or (_CAMEL.fullmatch(m.rsplit(".", 1)[-1])
                                                                         and m.rsplit(".", 1)[-1] in said)})
    index = {name: i for i, name in enumerate(names)}
    by_short: dict[str, list[int]] = {}
    for name in names:
        short = name.rsplit(".", 1)[-1]
        if "." in name and _CAMEL.fullmatch(short):
            by_short.setdefault(short, []).append(index[name])
    mentions = [(name, index[name]) for name in names if "." in name]  # a bare module name is mostly a word
    mentions += [(short, ids[0]) for short, ids in sorted(by_short.items()) if len(ids) == 1]
    surface = dict(mentions)
    triples = set()
    for name in names:
        parent = name.rsplit(".", 1)[0]
        if "." in name and parent in index:
            triples.add((index[name], index[parent], 0))
    for module, found in named.items():
        triples.update((index[module], surface[s], 1) for s in found if s in surface and surface[s] != index[module])
    return names, mentions, np.array(sorted(triples), np.int64).reshape(-1, 3)


def embedded_graph() -> pathlib.Path:
    """The embedded corpus's graph directory, built on first use (a few seconds) next to the corpus
    and keyed like it by the Python version and the standard library's file list."""
    root = embedded.stdlib_root()
    sources = embedded.stdlib_sources(root)
    key = hashlib.sha256("\n".join(str(s.relative_to(root)) for s in sources).encode()).hexdigest()[:12]
    directory = embedded.embedded_corpus_path().parent / f"ernie_kg_{key}"
    if not all((directory / f).is_file() for f in FILES):
        names, mentions, triples = stdlib_graph(sources)
        vectors = transe(triples, len(names), len(RELATIONS))
        directory.mkdir(parents=True, exist_ok=True)
        write_graph(directory, names, vectors, mentions, triples)
    return directory


def graph_directory(kg: str | None) -> pathlib.Path:
    """`data.kg`'s directory: the embedded graph for None or "embedded", else the path given."""
    return embedded_graph() if kg in (None, "embedded") else pathlib.Path(kg)


def lookup(entity_ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """The vector of each entity id [..., d] float32, zero where the id is -1 (no entity): the
    arrays the K-Encoder reads, in pretraining's batches and in fine-tuning's rows alike."""
    return np.where((entity_ids >= 0)[..., None], vectors[np.maximum(entity_ids, 0)], 0.0).astype(np.float32)


class MentionMatcher:
    """Finds mentions in rows of token ids, longest first, starting and ending on word boundaries
    (the lexicon's scan, `data.lexicon.longest_matches`), and aligns each one's entity to its
    first token (thunlp/ERNIE's alignment)."""

    def __init__(self, mentions: tuple[tuple[str, int], ...], tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        encoded: list[tuple[tuple[int, ...], int]] = [(tuple(tokenizer.encode(text)), entity) for text, entity in mentions]
        self.entries = index_entries(entry for entry in encoded if entry[0])

    def align(self, row: np.ndarray) -> np.ndarray:
        """The entity id aligned to each token of `row` (-1: none): at a mention's first token, the
        mention's entity; the rest of the mention and every other token -1. Mentions do not overlap."""
        out = np.full(len(row), -1, np.int32)
        for start, _, entity in longest_matches(self.entries, row, self.tokenizer):
            out[start] = entity
        return out
