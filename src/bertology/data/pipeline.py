"""From tokenized documents to global training batches, streamed, deterministically.

The stream is a sequence of *passes* over the training documents, and each pass a sequence of
*windows* of `data.window_documents` documents (default `WINDOW_DOCUMENTS`). Pass p visits the
documents in a global random order drawn from `(seed, p)` by grain's `index_shuffle` (a
permutation evaluated index by index, so no O(corpus) array of indices exists). Window w of pass p
is built from `(seed, p, w)` alone: its documents are read from the shards, the objective's
transform (`data.objective`, `transforms.py`) makes their instances, which are shuffled and, for a
transform that corrupts once per pass (static masking), corrupted once. Memory is one window's
instances plus the prefetched batches, whatever the corpus size.

Static masking reuses pass p mod dupe_factor (the transform's `copies`) for the order, the
instances and the masks, so exactly dupe_factor differently masked copies of the data exist, as
in BERT's create_pretraining_data.py, and each example's mask is a pure function of (seed, copy,
window, example). A corpus that fits one window is streamed exactly as whole in-memory passes
were (window 0 takes the pass's random streams, and its documents are read in corpus order), so
results on small corpora carry over. Dynamic masking (RoBERTa) builds fresh pairs each pass and draws fresh masks for
each batch from `(seed, step)`.

A mixture of corpora (`data.corpora`; one corpus is a mixture of one) streams each corpus as
above, with seeds of its own, and fills each row of a batch from a corpus drawn per row with
probability weight / sum of the weights from `(seed, step)`: the mixture holds at every step,
not only on average over whole windows, and a corpus that runs out starts its next pass by
itself. The iterator state is the step and each corpus's (pass, window, offset) and rows so far;
it is saved with each checkpoint, so a resumed run sees exactly the batches an uninterrupted run
would, also after a kill between checkpoints. Every process computes the same global batch and keeps its rows. A
background thread builds the next `prefetch` batches while the devices compute.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np
from grain.experimental import index_shuffle

from bertology.data import transforms
from bertology.data.tokenizers import Tokenizer
from bertology.data.transforms import Batch, Document
from bertology.errors import UserError

# Stream ids keep the random streams of different purposes independent for the same seed.
_PAIRS, _SHUFFLE, _MASK, _EVAL, _ORDER, _MIX, _CORPUS = 1, 2, 3, 4, 5, 6, 7
WINDOW_DOCUMENTS = 2048  # documents per window: BERT's random next sentences come from within it
PREFETCH = 2  # batches built ahead by the background thread
_ROUNDS = 4  # index_shuffle's Feistel rounds (grain's default for its global shuffle)


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def make_instances(documents: Sequence[Document], cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                   rng: np.random.Generator) -> Batch:
    """Uncorrupted instances of some documents for the config's data.objective, in the
    transform's order (what a window of the stream is built from; the benchmarks measure it alone)."""
    return transforms.make(cfg, tokenizer).instances(documents, rng)


class CorpusWindows:
    """One corpus's instances, window by window and pass by pass (see the module), read from a
    cursor {pass, window, offset}. Only the current window's instances are held."""

    def __init__(self, documents: Sequence[Document], transform: transforms.Transform, *, window: int, seed: int):
        if not len(documents):
            raise UserError("the corpus has no training documents; give it more text")
        self.documents = documents
        self.transform = transform
        self.window = window
        self.seed = seed
        # corpus.Documents reads a window's records in one call; a plain sequence one by one
        self._read = getattr(documents, "read", None) or (lambda indices: [documents[i] for i in indices])
        self.windows = -(-len(documents) // window)  # per pass
        self._cached: tuple[tuple[int, int], Batch] | None = None
        self._whole: list[Document] | None = None  # the documents of a one-window corpus

    def _source(self, p: int) -> int:
        """The pass whose order, instances and masks pass p repeats (p itself unless `copies`)."""
        copies = self.transform.copies
        return p % copies if copies else p

    def window_documents(self, p: int, w: int) -> list[int]:
        """Indices of the documents of window w of pass p: a slice of the pass's global order,
        read in corpus order (nearby records; the instances are shuffled afterwards)."""
        n = len(self.documents)
        if self.windows == 1:  # the whole corpus, in corpus order: no shuffle to evaluate
            return list(range(n))
        key = int(np.random.SeedSequence([self.seed, _ORDER, self._source(p)]).generate_state(1)[0])
        return sorted(index_shuffle(j, max_index=n - 1, seed=key, rounds=_ROUNDS)
                      for j in range(w * self.window, min((w + 1) * self.window, n)))

    def build(self, p: int, w: int = 0) -> Batch:
        """Window w of pass p (the whole pass when the corpus fits one window): its shuffled
        instances, corrupted now unless the transform corrupts each batch."""
        transform = self.transform
        key = (self._source(p), *([w] if w else []))  # window 0 keeps a whole pass's key (see the module)
        docs = self._window_docs(p, w)
        inst = transform.instances(docs, _rng(self.seed, _PAIRS, *key))
        order = _rng(self.seed, _SHUFFLE, *key).permutation(len(inst["input_ids"]))
        inst = {k: v[order] for k, v in inst.items()}
        if not transform.per_batch and len(order):
            inst = transform.corrupt(inst, _rng(self.seed, _MASK, *key))
        return inst

    def _window_docs(self, p: int, w: int) -> list[Document]:
        """The documents of window w of pass p. A corpus that fits one window is read once and
        kept: every pass reads the same documents, and they are no more than a window's worth."""
        if self.windows > 1:
            return self._read(self.window_documents(p, w))
        if self._whole is None:
            self._whole = self._read(self.window_documents(p, w))
        return self._whole

    def _window_at(self, p: int, w: int) -> Batch:
        if self._cached is None or self._cached[0] != (p, w):
            self._cached = ((p, w), self.build(p, w))
        return self._cached[1]

    def take(self, cursor: dict[str, int], need: int) -> list[Batch]:
        """The next `need` instances from `cursor` (in pieces, one per window they come from),
        advancing it to the next pass, reshuffled, where this one ends."""
        parts: list[Batch] = []
        empty = 0
        while need:
            inst = self._window_at(cursor["pass"], cursor["window"])
            n = len(inst["input_ids"])
            lo = cursor["offset"]
            take = min(need, n - lo)
            if take:
                parts.append({k: v[lo : lo + take] for k, v in inst.items()})
            need -= take
            cursor["offset"] += take
            empty = 0 if n else empty + 1
            if empty > self.windows:
                raise UserError("the corpus produced no training instances; give it more text")
            if cursor["offset"] == n:
                cursor["offset"] = 0
                cursor["window"] += 1
                if cursor["window"] == self.windows:
                    cursor["window"] = 0
                    cursor["pass"] += 1
        return parts


def corpus_seed(seed: int, i: int) -> int:
    """The seed of corpus i of a mixture: the run's own for the first (so a one-corpus mixture is
    the single corpus's stream), an independent one drawn from (seed, i) for the others."""
    return seed if i == 0 else int(np.random.SeedSequence([seed, _CORPUS, i]).generate_state(1)[0])


def mixed_rows(corpora: int, weights: Sequence[float], rows: int, rng: np.random.Generator) -> np.ndarray:
    """Which corpus each of `rows` rows comes from, drawn independently with P(i) = w_i / sum(w)."""
    p = np.asarray(weights, np.float64)
    return rng.choice(corpora, size=rows, p=p / p.sum())


def placed(pieces: Sequence[Sequence[Batch]], origin: np.ndarray) -> Batch:
    """One batch whose row r is the next unused row of corpus origin[r]'s pieces (each corpus's
    rows keep their order)."""
    parts = [piece for corpus in pieces for piece in corpus]
    rows = {k: np.concatenate([piece[k] for piece in parts]) for k in parts[0]}
    at = np.argsort(np.argsort(origin, kind="stable"), kind="stable")  # row r's index among the corpus-ordered rows
    return {k: v[at] for k, v in rows.items()}


class PretrainingStream:
    """Global batches of `batch_size` rows from a mixture of corpora (one corpus: a list of one);
    this process gets rows [start, stop).

    Row r of step s comes from corpus i with probability weights[i] / sum(weights) (equal weights
    unless given), drawn from (seed, step) (`mixed_rows`), and is that corpus's next instance:
    each corpus streams its own windows and passes (`CorpusWindows`, seeded by `corpus_seed`), so
    the rows of one corpus are its own stream in order, and one that runs out starts its next
    pass alone. The state is the step and every corpus's (pass, window, offset) with the rows it
    gave so far (the realised mixture: `proportions`)."""

    def __init__(
        self,
        corpora: Sequence[Sequence[Document]],
        tokenizer: Tokenizer,
        cfg: ml_collections.ConfigDict,
        *,
        batch_size: int,
        seed: int,
        weights: Sequence[float] | None = None,
        names: Sequence[str] = (),
        report: Callable[[str], None] = print,
        report_every: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        prefetch: int = PREFETCH,
    ):
        self.transform = transforms.make(cfg, tokenizer)
        if batch_size % process_count:
            raise UserError(f"batch_size {batch_size} is not divisible by the {process_count} processes")
        window = int(cfg.get("window_documents", WINDOW_DOCUMENTS))
        if window < 2:
            raise UserError(f"data.window_documents={window} is too small; use at least 2 (default "
                            f"{WINDOW_DOCUMENTS})")
        self.weights = [1.0] * len(corpora) if weights is None else [float(w) for w in weights]
        self.report, self.report_every = report, report_every  # `describe` every that many steps (0: never)
        self.names = list(names) or [f"corpus {i}" for i in range(len(corpora))]
        self.corpora = [CorpusWindows(d, self.transform, window=window, seed=corpus_seed(seed, i))
                        for i, d in enumerate(corpora)]
        self.batch_size = batch_size
        self.seed = seed
        self.prefetch = prefetch
        rows = batch_size // process_count
        self.rows = slice(process_index * rows, (process_index + 1) * rows)
        self.state = self._start()
        self._cursor = _copy(self.state)  # where the producer is (ahead of `state` by the prefetched batches)
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue(max(prefetch, 1))
        self._stop = threading.Event()

    def _start(self) -> dict[str, Any]:
        return {"step": 0, "corpora": [{"pass": 0, "window": 0, "offset": 0, "rows": 0} for _ in self.corpora]}

    def _make_batch(self, cursor: dict[str, Any]) -> Batch:
        """The global batch at `cursor`, advancing it."""
        origin = mixed_rows(len(self.corpora), self.weights, self.batch_size, _rng(self.seed, _MIX, cursor["step"]))
        pieces = []
        for i, (corpus, position) in enumerate(zip(self.corpora, cursor["corpora"])):
            need = int(np.count_nonzero(origin == i))
            pieces.append(corpus.take(position, need))
            position["rows"] += need
        batch = placed(pieces, origin)
        if self.transform.per_batch:
            batch = self.transform.corrupt(batch, _rng(self.seed, _MASK, cursor["step"]))
        cursor["step"] += 1
        return {k: v[self.rows] for k, v in batch.items()}

    def proportions(self) -> list[float]:
        """The share of the rows so far that each corpus gave (the realised mixture)."""
        rows = np.array([position["rows"] for position in self.state["corpora"]], np.float64)
        return (rows / max(rows.sum(), 1)).tolist()

    def describe(self) -> str:
        """The realised mixture beside the weights, for the log."""
        total = sum(self.weights)
        return f"data mixture at step {self.state['step']}: " + " | ".join(
            f"{name} {share:.1%} (weight {w / total:.1%})"
            for name, share, w in zip(self.names, self.proportions(), self.weights))

    def _produce(self) -> None:
        """The background thread: batches with the state after each, until stopped."""
        while not self._stop.is_set():
            try:
                item = (self._make_batch(self._cursor), _copy(self._cursor))
            except BaseException as e:  # handed to the consumer, which raises it
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        if not self.prefetch:
            batch = self._make_batch(self._cursor)
            self.state = _copy(self._cursor)
        else:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._produce, name="batch-prefetch", daemon=True)
                self._thread.start()
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._halt()
                raise item
            batch, self.state = item
        if self.report_every and len(self.corpora) > 1 and self.state["step"] % self.report_every == 0:
            self.report(self.describe())
        return batch

    def _halt(self) -> None:
        """Stop the producer and drop what it built ahead."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._queue = queue.Queue(max(self.prefetch, 1))

    def get_state(self) -> dict[str, Any]:
        return _copy(self.state)

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from `state` (a checkpoint's). A checkpoint written before mixtures holds one
        corpus's position at the top level, and one older still no "window" (a pass start)."""
        positions = state.get("corpora", [state])
        if len(positions) != len(self.corpora):
            raise UserError(f"the checkpoint's data position is for {len(positions)} corpora, but the config names "
                            f"{len(self.corpora)}; resume with the corpora it was trained on, or use a new --workdir")
        self._halt()
        self.state = {"step": int(state.get("step", 0)),
                      "corpora": [{k: int(p.get(k, 0)) for k in ("pass", "window", "offset", "rows")}
                                  for p in positions]}
        self._cursor = _copy(self.state)


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    return {"step": state["step"], "corpora": [dict(p) for p in state["corpora"]]}


def eval_batches(
    corpora: Sequence[Sequence[Document]],
    tokenizer: Tokenizer,
    cfg: ml_collections.ConfigDict,
    *,
    batch_size: int,
    num_batches: int,
    seed: int,
    weights: Sequence[float] | None = None,
) -> list[Batch]:
    """A fixed list of held-out batches (corrupted once, e.g. masked) of the held-out documents
    of `corpora`, so eval numbers compare across steps and runs. Each row comes from a corpus
    drawn once with the training stream's probabilities (`weights`), each corpus's rows being its
    first held-out instances in order (`_held_out`)."""
    transform = transforms.make(cfg, tokenizer)
    need = batch_size * num_batches
    origin = mixed_rows(len(corpora), [1.0] * len(corpora) if weights is None else weights, need,
                        _rng(seed, _EVAL, 2))
    inst = placed([[_held_out(transform, d, int(np.count_nonzero(origin == i)), corpus_seed(seed, i))]
                   for i, d in enumerate(corpora)], origin)
    inst = transform.corrupt(inst, _rng(seed, _EVAL, 1))
    return [{k: v[i * batch_size : (i + 1) * batch_size] for k, v in inst.items()} for i in range(num_batches)]


def _held_out(transform: transforms.Transform, documents: Sequence[Document], need: int, seed: int) -> Batch:
    """`need` uncorrupted instances of the first held-out documents that give enough (doubling
    from 64; not the whole split, which grows with the corpus), repeated if all of them give fewer."""
    k = min(64, len(documents))
    while True:
        inst = transform.instances([documents[i] for i in range(k)], _rng(seed, _EVAL, 0))
        n = len(inst["input_ids"])
        if n >= need or k == len(documents):
            break
        k = min(2 * k, len(documents))
    if n == 0:
        raise UserError("the validation split produced no instances; give the corpus more documents")
    idx = np.arange(need) % n
    return {k: v[idx] for k, v in inst.items()}
