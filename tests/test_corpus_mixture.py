"""Pretraining on a mixture of corpora (`data.corpora`): per-row proportions, each corpus's own
stream in order, exact resume of a run, and the config's one-line errors."""

import math

import jax
import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import tiny_config

from bertology import validation
from bertology.data import corpus as corpus_lib
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.pipeline import PretrainingStream, corpus_seed
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.train.loop import train

WEIGHTS = (3.0, 1.0)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A text file of 60 documents and a parquet table of 24 (other words), prepared once."""
    root = tmp_path_factory.mktemp("mixture")
    text = []
    for d in range(60):
        text += [f"Document {d} of the text file opens here.", f"Its second sentence counts {d} apples.", ""]
    (root / "a.txt").write_text("\n".join(text))
    rows = [{"text": f"Row {d} of the table talks about rivers. Rivers run {d} miles to the sea."} for d in range(24)]
    pq.write_table(pa.Table.from_pylist(rows), root / "b.parquet")
    return root


def _splits(root):
    tok = load_tokenizer(DEFAULT_VOCAB)
    return tok, [corpus_lib.load_documents(root / name, tok, DEFAULT_VOCAB, root / "cache", log=lambda m: None,
                                           workers=1) for name in ("a.txt", "b.parquet")]


def _cfg(**kw):
    return ml_collections.ConfigDict({**dict(max_seq_length=32, max_predictions_per_seq=5, masked_lm_prob=0.15,
                                             short_seq_prob=0.1, masking="static", dupe_factor=2, window_documents=8),
                                      **kw})


def _rows(stream, n):
    """The first n rows of a stream (batches concatenated), one dict per row."""
    out = []
    while len(out) < n:
        batch = next(stream)
        out += [{k: v[r] for k, v in batch.items()} for r in range(len(batch["input_ids"]))]
    return out[:n]


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_rows_follow_the_weights_and_each_corpus_keeps_its_own_stream(corpora):
    tok, splits = _splits(corpora)
    steps, batch = 60, 16
    mixed = PretrainingStream([s["train"] for s in splits], tok, _cfg(), batch_size=batch, seed=0, weights=WEIGHTS)
    rows = _rows(mixed, steps * batch)
    # Each corpus alone, under the seed the mixture gives it (corpus 0: the run's own), is the stream
    # its rows must follow in order, across its windows and passes.
    alone = [_rows(PretrainingStream([s["train"]], tok, _cfg(), batch_size=batch, seed=corpus_seed(0, i)), len(rows))
             for i, s in enumerate(splits)]
    assert corpus_seed(0, 0) == 0 and corpus_seed(0, 1) != 0
    used = [0, 0]
    for row in rows:
        matches = [i for i in (0, 1) if _same(row, alone[i][used[i]])]
        assert len(matches) == 1  # the next row of exactly one corpus's own stream
        used[matches[0]] += 1
    n, p = len(rows), WEIGHTS[0] / sum(WEIGHTS)
    assert abs(used[0] - n * p) <= 4 * math.sqrt(n * p * (1 - p))  # 4 binomial standard deviations
    state = mixed.get_state()
    assert [c["rows"] for c in state["corpora"]] == used and mixed.proportions() == [u / n for u in used]
    assert min(c["pass"] for c in state["corpora"]) >= 2  # both corpora ran out and started new passes
    assert "corpus 0 " in mixed.describe() and "(weight 75.0%)" in mixed.describe()


def test_a_mixture_resumes_exactly_from_its_state(corpora):
    tok, splits = _splits(corpora)
    make = lambda: PretrainingStream([s["train"] for s in splits], tok, _cfg(masking="dynamic"), batch_size=8,  # noqa: E731
                                     seed=3, weights=WEIGHTS)
    first = make()
    straight = [next(first) for _ in range(50)]
    stopped = make()
    for _ in range(23):
        next(stopped)
    resumed = make()
    resumed.set_state(stopped.get_state())
    assert all(_same(a, b) for a, b in zip(straight[23:], [next(resumed) for _ in range(27)]))


def _run(root, work, steps):
    c = tiny_config(total_steps=steps, checkpoint_every=4, allow_config_change="total_steps",
                    **{"optimizer.schedule_steps": 12, "data.window_documents": 8, "data.cache_dir": str(root / "cache"),
                       "data.corpora": tuple({"path": str(root / n), "weight": w}
                                             for n, w in zip(("a.txt", "b.parquet"), WEIGHTS))})
    return train(c, work)


@pytest.mark.slow
def test_a_mixture_run_stopped_at_a_checkpoint_resumes_bit_identically(corpora, tmp_path):
    straight = _run(corpora, tmp_path / "straight", 12)
    first = _run(corpora, tmp_path / "split", 6)
    second = _run(corpora, tmp_path / "split", 12)  # resumes from the step-6 checkpoint
    assert second["history"][0]["step"] == 7
    loss = lambda out: [h["loss"] for h in out["history"]]  # noqa: E731
    np.testing.assert_array_equal(loss(first) + loss(second), loss(straight))
    for a, b in zip(jax.tree.leaves(second["state"]["params"]), jax.tree.leaves(straight["state"]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("entries, corpus, message", [
    (({"path": "a.txt", "weight": 0},), None, r"data.corpora\[0\].weight=0 is not a finite number > 0"),
    (({"path": "a.txt", "weight": 3}, {"path": "b.parquet", "weight": float("nan")}), None,
     r"data.corpora\[1\].weight=nan is not a finite number > 0"),
    (({"path": "a.txt", "weight": float("inf")},), None, r"weight=inf is not a finite number > 0"),
    (({"path": "a.txt", "weight": "3"},), None, r"weight='3' is not a finite number > 0"),
    (({"path": "missing.txt", "weight": 1},), None, r"data.corpora\[0\].path='.*missing.txt' does not exist"),
    (({"path": "a.txt"},), None, r"data.corpora\[0\]=.* is not \{\"path\": PATH, \"weight\": NUMBER\}"),
    (({"path": "a.txt", "weight": 1},), "a.txt", r"is set together with data.corpus=.*; set only one"),
])
def test_bad_mixtures_are_one_line_user_errors(corpora, entries, corpus, message):
    c = tiny_config()
    c.data.corpus = None if corpus is None else str(corpora / corpus)
    c.data.corpora = tuple({**e, "path": str(corpora / e["path"])} if "path" in e else e for e in entries)
    with pytest.raises(UserError, match=message) as error:
        validation.check(c)
    assert "\n" not in str(error.value)


def test_a_contiguous_objective_takes_one_corpus(corpora):
    c = tiny_config()
    c.data.objective = "contiguous_lm"
    c.data.corpora = tuple({"path": str(corpora / n), "weight": 1} for n in ("a.txt", "b.parquet"))
    with pytest.raises(UserError, match="reads one contiguous token stream; set data.corpus"):
        validation.check(c)
