"""XLNet's data (`data/permutation.py`, the `xlnet` transform) against the reference's rules
(zihangdai/xlnet data_utils.py): permutation masks against a direct construction from the
factorisation order, span statistics against p ∝ 1/n and beta/(alpha + beta), the reference's
n-sub-word bug, lanes that continue each other, bi_data's reversed half, determinism by seed and
the config checks."""

import types

import ml_collections
import numpy as np
import pytest

from bertology import validation
from bertology.data import permutation, transforms
from bertology.errors import UserError

SEP, CLS, EOS = 3, 2, 5
WORD_STARTS = np.random.default_rng(7).random(1000) < 0.6
WORD_STARTS[:10] = True  # specials start words, as every tokenizer here says
TOK = types.SimpleNamespace(vocab_size=1000, pad_id=0, cls_id=CLS, sep_id=SEP, mask_id=4, unk_id=1, eos_id=EOS,
                            special_ids=frozenset(range(6)), word_starts=lambda ids: WORD_STARTS[np.asarray(ids)])


def docs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(10, 1000, rng.integers(0, 25)) for _ in range(rng.integers(1, 6))] for _ in range(n)]


def stream_of(documents):
    """The corpus as the transform must read it: documents in order, EOS after each."""
    out = []
    for doc in documents:
        tokens = [int(t) for s in doc for t in s]
        if tokens:
            out += tokens + [EOS]
    return np.array(out)


def direct_mask(rank, is_target):
    """Who sees whom, from the factorisation order itself: tokens outside it (rank -1) form a
    context every position sees and that sees nothing of the order; a position in the order sees
    the context, the positions before it and, unless it is a target, itself."""
    length = len(rank)
    context = {j for j in range(length) if rank[j] < 0}
    order = sorted((j for j in range(length) if rank[j] >= 0), key=lambda j: rank[j])
    blocked = np.ones((length, length), np.int8)
    for i in range(length):
        seen = set(context)
        if rank[i] >= 0:
            k = order.index(i)
            seen |= set(order[:k]) | (set() if is_target[i] else {i})
        blocked[i, sorted(seen)] = 0
    return blocked


@pytest.mark.parametrize("seed", range(4))
def test_perm_mask_equals_direct_construction(seed):
    rng = np.random.default_rng(seed)
    length, perm = 24, 8
    is_masked = rng.random(length) < 0.3
    functional = np.zeros(length, bool)
    functional[rng.choice(length, 3, replace=False)] = True
    rank, is_target = permutation.local_perm(is_masked, functional, perm, rng)
    np.testing.assert_array_equal(is_target, is_masked & ~functional)
    assert (rank[~is_masked & ~functional] == -1).all() and (rank[is_masked | functional] >= 0).all()
    # ranks: block b keeps to [b·perm, (b+1)·perm) and every block is permuted the same way
    full, _ = permutation.local_perm(np.ones(length, bool), np.zeros(length, bool), perm, np.random.default_rng(seed))
    blocks = full.reshape(-1, perm)
    np.testing.assert_array_equal(blocks - blocks[:1], np.arange(0, length, perm)[:, None] + np.zeros(perm, int))
    np.testing.assert_array_equal(np.sort(blocks[0]), np.arange(perm))
    mask = permutation.perm_mask(rank, is_target)
    np.testing.assert_array_equal(mask, direct_mask(rank, is_target))
    # no target sees itself or anything later in the order
    for i in np.flatnonzero(is_target):
        later = np.flatnonzero((rank >= rank[i]))
        assert mask[i, later].all() and mask[i, i] == 1


def test_row_perm_mask_halves():
    rng = np.random.default_rng(3)
    length, reuse = 32, 16
    is_masked = rng.random(length) < 0.3
    functional = np.zeros(length, bool)
    functional[[25, 30, 31]] = True
    mask, is_target = permutation.row_perm_mask(is_masked, functional, reuse, 8, np.random.default_rng(0))
    assert mask[:reuse, reuse:].all() and not mask[reuse:, :reuse].any()
    again = np.random.default_rng(0)
    for part in (slice(0, reuse), slice(reuse, length)):  # each half is its own local_perm, in this order
        rank, target = permutation.local_perm(is_masked[part], functional[part], 8, again)
        np.testing.assert_array_equal(mask[part, part], permutation.perm_mask(rank, target))
        np.testing.assert_array_equal(is_target[part], target)


def test_target_mapping_pads_to_num_predict():
    is_target = np.zeros(12, bool)
    is_target[[1, 4, 5, 9]] = True
    mapping, positions, weights = permutation.target_mapping(is_target, 6)
    np.testing.assert_array_equal(mapping.argmax(1)[:4], [1, 4, 5, 9])
    np.testing.assert_array_equal(mapping.sum(1), [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(positions[:4], [1, 4, 5, 9])
    np.testing.assert_array_equal(weights, [1, 1, 1, 1, 0, 0])


def runs(chosen):
    """(start, length) of each run of chosen tokens."""
    edges = np.diff(np.concatenate([[0], chosen.astype(int), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return starts, ends - starts


def test_span_statistics_follow_one_over_n_and_k():
    rng = np.random.default_rng(0)
    word_starts = rng.random(200_000) < 0.5
    chosen = permutation.span_targets(word_starts, rng, num_predict=None, alpha=6, beta=1)
    starts, lengths = runs(chosen)
    expected = (1 / np.arange(1, 6)) / (1 / np.arange(1, 6)).sum()
    observed = np.bincount(lengths, minlength=6)[1:] / len(lengths)
    np.testing.assert_allclose(observed, expected, atol=0.015)
    assert abs(lengths.mean() - 5 / (1 / np.arange(1, 6)).sum()) < 0.05  # E[n] = 5 / H_5 = 2.19
    # the reference's bug: every span starts at a word start but is n sub-word tokens long, so it
    # also covers non-word-start tokens (a whole-word n-gram would extend to the next word start)
    assert word_starts[starts].all()
    assert (~word_starts[chosen]).mean() > 0.2
    # each n-gram sits in n·alpha/beta context tokens plus the step to a word start (mean 1 here)
    fraction = chosen.mean()
    assert abs(fraction - lengths.mean() / (7 * lengths.mean() + 1)) < 0.005
    assert 1 / 8 < fraction < 1 / 6


@pytest.mark.parametrize("length,count", [(256, 43), (256, 42), (40, 7), (12, 12)])
def test_span_targets_hit_num_predict_exactly(length, count):
    for seed in range(5):
        chosen = permutation.span_targets(WORD_STARTS[np.arange(length) % 1000], np.random.default_rng(seed),
                                          num_predict=count)
        assert chosen.sum() == count


def test_split_a_and_b_rules():
    rng = np.random.default_rng(0)
    lane = np.arange(2000)
    sent = (np.cumsum(rng.random(2000) < 0.1) % 2).astype(np.int8)  # sentences of ~10 tokens
    labels = []
    for begin in range(0, 1800, 37):
        a, b, label = permutation.split_a_and_b(lane, sent, begin, 61, rng)
        labels.append(label)
        assert len(a) + len(b) == 61 and len(a) >= 1 and len(b) >= 1
        np.testing.assert_array_equal(a, lane[begin:begin + len(a)])
        assert (np.diff(b) == 1).all()  # a stretch of the lane
        if label == 1:
            assert b[0] == begin + len(a) or len(a) > len(b)  # B continues A unless A was cut back
    assert 0.3 < np.mean(labels) < 0.7
    assert permutation.split_a_and_b(lane, sent, 1950, 61, rng) is None


def make(**kw):
    fields = dict(objective="xlnet", max_seq_length=32, reuse_len=16, perm_size=8, num_predict=6, bi_data=False)
    fields.update(kw)
    return transforms.make(ml_collections.ConfigDict(fields), TOK)


def test_lanes_continue_each_other_and_rows_have_the_reference_layout():
    t = make()
    documents = docs()
    inst = t.instances(documents, np.random.default_rng(0), 4)
    lanes, steps, length = inst["input_ids"].shape
    assert steps > 3 and length == 32
    stream = stream_of(documents)
    per_lane = len(stream) // lanes
    cut = stream[: lanes * per_lane].reshape(lanes, per_lane)
    reuse = inst["input_ids"][:, :, :16]
    np.testing.assert_array_equal(reuse.reshape(lanes, -1), cut[:, : steps * 16])
    for b in range(lanes):
        for s in range(steps):
            ids, seg = inst["input_ids"][b, s], inst["segment_ids"][b, s]
            a_len = (seg[16:] == 0).sum() - 1
            assert ids[-1] == CLS and ids[-2] == SEP and ids[16 + a_len] == SEP
            np.testing.assert_array_equal(seg, [0] * (17 + a_len) + [1] * (15 - a_len - 1) + [2])
            # A starts where the lane goes on: the next step's reused part
            np.testing.assert_array_equal(ids[16:16 + a_len], cut[b, (s + 1) * 16:(s + 1) * 16 + a_len])
    assert (inst["input_mask"] == 1).all()
    np.testing.assert_array_equal(inst["carry_reset"], np.eye(steps, dtype=np.int32)[0][None].repeat(lanes, 0))
    np.testing.assert_array_equal(inst["is_masked"][..., :16].sum(-1), 3)
    np.testing.assert_array_equal(inst["is_masked"][..., 16:].sum(-1), 3)


def test_bi_data_second_half_is_the_reversed_lanes():
    t = make(bi_data=True)
    documents = docs()
    inst = t.instances(documents, np.random.default_rng(0), 4)
    steps = inst["input_ids"].shape[1]
    stream = stream_of(documents)
    per_lane = len(stream) // 2
    forward = stream[: 2 * per_lane].reshape(2, per_lane)
    reuse = inst["input_ids"][:, :, :16].reshape(4, -1)
    np.testing.assert_array_equal(reuse[:2], forward[:, : steps * 16])
    np.testing.assert_array_equal(reuse[2:], forward[:, ::-1][:, : steps * 16])
    # spans on a reversed lane start at word starts read forwards, i.e. at the run's right end
    # (top-up tokens are random, so compare the two ends over all rows)
    masked = inst["is_masked"][2:, :, :16].astype(bool).reshape(-1, 16)[:, ::-1]
    ids = inst["input_ids"][2:, :, :16].reshape(-1, 16)[:, ::-1]
    at_start, at_end = [], []
    for row, m in zip(ids, masked):
        starts, lengths = runs(m)
        at_start += list(WORD_STARTS[row[starts]])
        at_end += list(WORD_STARTS[row[starts + lengths - 1]][lengths > 1])
    assert np.mean(at_start) > 0.78 and np.mean(at_end) < 0.7  # 0.83 and 0.60 (the base rate) at seed 0


def test_corrupt_builds_the_model_keys():
    t = make()
    inst = t.instances(docs(), np.random.default_rng(0), 4)
    step = {k: v[:, 2] for k, v in inst.items()}
    batch = t.corrupt(step, np.random.default_rng(5))
    assert "is_masked" not in batch
    assert batch["perm_mask"].shape == (4, 32, 32) and batch["target_mapping"].shape == (4, 6, 32)
    for r in range(4):
        ids, w = batch["input_ids"][r], batch["target_weights"][r]
        positions = batch["target_mapping"][r].argmax(1)[w > 0]
        expected = np.flatnonzero(step["is_masked"][r].astype(bool) & ~np.isin(ids, [SEP, CLS]))
        np.testing.assert_array_equal(positions, expected)
        np.testing.assert_array_equal(batch["targets"][r][w > 0], ids[positions])
        assert (batch["targets"][r][w == 0] == 0).all()
        assert batch["perm_mask"][r][positions, positions].all()  # no target sees itself
        assert batch["perm_mask"][r][:16, 16:].all() and not batch["perm_mask"][r][16:, :16].any()


def test_determinism_by_seed():
    t = make(bi_data=True)
    documents = docs(200)
    one, two = (t.instances(documents, np.random.default_rng(9), 4) for _ in range(2))
    other = t.instances(documents, np.random.default_rng(10), 4)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])
    assert not np.array_equal(one["is_masked"], other["is_masked"])
    step = {k: v[:, 1] for k, v in one.items()}
    a, b = t.corrupt(step, np.random.default_rng(1)), t.corrupt(step, np.random.default_rng(1))
    c = t.corrupt(step, np.random.default_rng(2))
    np.testing.assert_array_equal(a["perm_mask"], b["perm_mask"])
    assert not np.array_equal(a["perm_mask"], c["perm_mask"])


def run_config(batch_size=8, **data):
    fields = dict(objective="xlnet", max_seq_length=64)
    fields.update(data)
    return ml_collections.ConfigDict(dict(total_steps=1, batch_size=batch_size, data=fields))


@pytest.mark.parametrize("batch_size,data,key", [
    (8, dict(reuse_len=61), "data.reuse_len"),
    (8, dict(reuse_len=32, perm_size=12), "data.perm_size"),
    (8, dict(reuse_len=16, num_predict=40), "data.num_predict"),
    (8, dict(mask_alpha=1, mask_beta=2, num_predict=10), "data.mask_alpha"),
    (7, dict(), "batch_size"),
    (8, dict(bi_data="yes"), "data.bi_data"),
    (8, dict(cls_position="end"), "data.cls_position"),
])
def test_config_checks(batch_size, data, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        validation.check(run_config(batch_size, **data))


def test_reference_defaults_pass_the_checks():
    validation.check(run_config(8, max_seq_length=512))
    o = permutation.Settings.from_config(ml_collections.ConfigDict(dict(max_seq_length=512)))
    assert (o.reuse_len, o.perm_size, o.num_predict, o.bi_data, o.mask_alpha, o.mask_beta) == (256, 256, 85, True, 6, 1)
    assert o.predict_in_reuse == 43
    validation.check(run_config(7, bi_data=False))
