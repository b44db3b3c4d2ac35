"""The batch stream: determinism, static vs dynamic masking, exact restore, per-process rows."""

import types

import ml_collections
import numpy as np
import pytest

from bertology.data.pipeline import PretrainingStream, eval_batches

TOK = types.SimpleNamespace(vocab_size=1000, pad_id=0, cls_id=2, sep_id=3, mask_id=4, unk_id=1,
                            special_ids=frozenset({0, 1, 2, 3, 4}))


def docs(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(10, 1000, rng.integers(3, 20)).astype(np.int32) for _ in range(rng.integers(2, 12))]
            for _ in range(n)]


def cfg(**kw):
    fields = dict(max_seq_length=32, max_predictions_per_seq=5, masked_lm_prob=0.15,
                  short_seq_prob=0.1, masking="static", dupe_factor=3)
    fields.update(kw)
    return ml_collections.ConfigDict(fields)


def take(stream, n):
    return [next(stream) for _ in range(n)]


def same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_batches_are_a_function_of_the_seed():
    a = take(PretrainingStream([docs()], TOK, cfg(), batch_size=8, seed=1), 20)
    b = take(PretrainingStream([docs()], TOK, cfg(), batch_size=8, seed=1), 20)
    c = take(PretrainingStream([docs()], TOK, cfg(), batch_size=8, seed=2), 20)
    assert all(same(x, y) for x, y in zip(a, b))
    assert not all(same(x, y) for x, y in zip(a, c))
    keys = {"input_ids", "segment_ids", "input_mask", "next_sentence_label", "masked_positions", "masked_ids", "masked_weights"}
    assert set(a[0]) == keys and a[0]["input_ids"].shape == (8, 32) and a[0]["masked_ids"].shape == (8, 5)


def test_restored_state_continues_the_same_stream():
    s = PretrainingStream([docs()], TOK, cfg(masking="dynamic"), batch_size=8, seed=0)
    take(s, 37)  # crosses several passes
    state = s.get_state()
    assert state["corpora"][0]["pass"] > 0
    expected = take(s, 10)
    r = PretrainingStream([docs()], TOK, cfg(masking="dynamic"), batch_size=8, seed=0)
    r.set_state(state)
    assert all(same(x, y) for x, y in zip(expected, take(r, 10)))


def _pass(stream, p):
    return stream.corpora[0].build(p)  # the corpus is one window


def test_static_masking_repeats_every_dupe_factor_passes():
    s = PretrainingStream([docs()], TOK, cfg(masking="static", dupe_factor=3), batch_size=4, seed=0)
    p0, p1, p3 = _pass(s, 0), _pass(s, 1), _pass(s, 3)
    assert same(p0, p3)  # pass 3 is copy 0 again: exactly dupe_factor distinct copies
    assert not np.array_equal(p0["masked_positions"][:10], p1["masked_positions"][:10])


def test_dynamic_masking_draws_new_masks_for_the_same_sequences():
    d = docs()
    a = PretrainingStream([d], TOK, cfg(masking="dynamic"), batch_size=8, seed=0)
    b = PretrainingStream([d], TOK, cfg(masking="dynamic"), batch_size=8, seed=0)
    b.set_state({"pass": 0, "offset": 0, "step": 1000})  # same rows, a later step
    x, y = next(a), next(b)
    # The same unmasked sequences, masked differently.
    assert np.array_equal(unmask(x), unmask(y))
    assert not np.array_equal(x["masked_positions"], y["masked_positions"])


def unmask(batch):
    """The original ids: masked_ids written back at masked_positions."""
    ids = batch["input_ids"].copy()
    rows = np.broadcast_to(np.arange(len(ids))[:, None], batch["masked_positions"].shape)
    real = batch["masked_weights"] > 0
    ids[rows[real], batch["masked_positions"][real]] = batch["masked_ids"][real]
    return ids


def test_processes_get_disjoint_rows_of_the_same_global_batch():
    full = take(PretrainingStream([docs()], TOK, cfg(), batch_size=8, seed=0), 5)
    parts = [take(PretrainingStream([docs()], TOK, cfg(), batch_size=8, seed=0, process_index=i, process_count=2), 5)
             for i in range(2)]
    for step in range(5):
        for k in full[step]:
            np.testing.assert_array_equal(np.concatenate([parts[0][step][k], parts[1][step][k]]), full[step][k])


def test_eval_batches_are_fixed():
    a = eval_batches([docs(10, 5)], TOK, cfg(), batch_size=4, num_batches=3, seed=0)
    b = eval_batches([docs(10, 5)], TOK, cfg(), batch_size=4, num_batches=3, seed=0)
    assert len(a) == 3 and all(same(x, y) for x, y in zip(a, b))


def test_unknown_masking_is_a_user_error():
    from bertology.errors import UserError

    with pytest.raises(UserError, match="data.masking='sometimes'"):
        PretrainingStream([docs()], TOK, cfg(masking="sometimes"), batch_size=8, seed=0)


# ------------------------------------------------------------------ streaming over windows


class CountingDocuments(list):
    """A document list that records which documents were read."""

    def __init__(self, items):
        super().__init__(items)
        self.seen = []

    def __getitem__(self, i):
        self.seen.append(i)
        return super().__getitem__(i)


def test_a_pass_visits_every_document_once_in_shuffled_windows():
    s = PretrainingStream([docs(40)], TOK, cfg(window_documents=8), batch_size=8, seed=0)
    (corpus,) = s.corpora
    assert corpus.windows == 5
    passes = [[corpus.window_documents(p, w) for w in range(5)] for p in range(2)]
    for windows in passes:
        assert sorted(i for w in windows for i in w) == list(range(40))
        assert all(w == sorted(w) for w in windows)  # read in corpus order
    assert passes[0] != passes[1]  # another pass groups the documents differently
    assert passes[0] != [list(range(k, k + 8)) for k in range(0, 40, 8)]  # not the corpus order


def test_documents_are_read_one_window_at_a_time():
    d = CountingDocuments(docs(40))
    s = PretrainingStream([d], TOK, cfg(window_documents=8), batch_size=4, seed=0, prefetch=0)
    next(s)
    assert sorted(d.seen) == s.corpora[0].window_documents(0, 0)  # 8 of the 40 documents, nothing else


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_windowed_stream_resumes_exactly_and_prefetch_changes_nothing(masking):
    c = cfg(masking=masking, window_documents=8)
    sync = take(PretrainingStream([docs()], TOK, c, batch_size=8, seed=3, prefetch=0), 60)
    s = PretrainingStream([docs()], TOK, c, batch_size=8, seed=3, prefetch=3)
    ahead = take(s, 37)
    assert all(same(x, y) for x, y in zip(ahead, sync))
    state = s.get_state()
    (position,) = state["corpora"]
    assert position["pass"] >= 1 and position["window"] + position["offset"] > 0  # mid-pass, several windows in
    r = PretrainingStream([docs()], TOK, c, batch_size=8, seed=3)
    r.set_state(state)
    assert all(same(x, y) for x, y in zip(take(r, 23), sync[37:]))


def test_static_masking_repeats_every_window_every_dupe_factor_passes():
    s = PretrainingStream([docs()], TOK, cfg(masking="static", dupe_factor=2, window_documents=8), batch_size=4, seed=0)
    (corpus,) = s.corpora
    for w in range(corpus.windows):
        assert same(corpus.build(0, w), corpus.build(2, w))
        assert not same(corpus.build(0, w), corpus.build(1, w))


def test_processes_get_disjoint_rows_of_windowed_batches():
    c = cfg(masking="dynamic", window_documents=8)
    full = take(PretrainingStream([docs()], TOK, c, batch_size=8, seed=0), 30)
    parts = [take(PretrainingStream([docs()], TOK, c, batch_size=8, seed=0, process_index=i, process_count=2), 30)
             for i in range(2)]
    for step in range(30):
        for k in full[step]:
            np.testing.assert_array_equal(np.concatenate([parts[0][step][k], parts[1][step][k]]), full[step][k])


def test_the_stream_from_array_record_shards_equals_the_stream_from_a_list(tmp_path):
    """The prepared corpus read by index gives the batches the same documents in memory give."""
    from bertology.data import corpus as corpus_lib
    from bertology.data.embedded import DEFAULT_VOCAB
    from bertology.data.tokenizers import load_tokenizer

    tok = load_tokenizer(DEFAULT_VOCAB)
    lines = [f"Sentence {k} of document {d} says {'more ' * (k % 5)}things." for d in range(60) for k in range(d % 6 + 1)]
    text, k = [], 0
    for d in range(60):
        text += lines[k : k + d % 6 + 1] + [""]
        k += d % 6 + 1
    (tmp_path / "c.txt").write_text("\n".join(text))
    on_disk = corpus_lib.load_documents(tmp_path / "c.txt", tok, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None)
    in_memory = [list(d) for d in on_disk["train"]]
    c = cfg(masking="dynamic", window_documents=16)
    a = take(PretrainingStream([on_disk["train"]], tok, c, batch_size=8, seed=0), 12)
    b = take(PretrainingStream([in_memory], tok, c, batch_size=8, seed=0), 12)
    assert all(same(x, y) for x, y in zip(a, b))


def test_an_error_while_prefetching_reaches_the_caller():
    from bertology.errors import UserError

    empty = [[np.zeros(0, np.int32)] for _ in range(10)]
    with pytest.raises(UserError, match="no training instances"):
        next(PretrainingStream([empty], TOK, cfg(window_documents=4), batch_size=8, seed=0))
