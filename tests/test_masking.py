"""MLM masking: exact per-row counts, the 80/10/10 split, specials untouched, determinism."""

import numpy as np
import pytest

from bertology.data.masking import mask_tokens
from bertology.errors import UserError

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = (PAD, CLS, SEP, MASK)
VOCAB = 40  # small, so a random replacement often equals the original and must be accounted for
ALLOWED = VOCAB - len(SPECIAL)


def batch(rows=4000, length=128, seed=0):
    """Rows `[CLS] x [SEP] y [SEP] pad...` of random lengths; [UNK] is an ordinary, maskable id."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(UNK, VOCAB, (rows, length))
    ids[np.isin(ids, SPECIAL)] = UNK
    n = rng.integers(3, length + 1, rows)
    ids[np.arange(length) >= n[:, None]] = PAD
    ids[:, 0] = CLS
    ids[np.arange(rows), n - 1] = SEP
    ids[np.arange(rows), n // 2] = SEP
    return ids.astype(np.int32), n


def mask(ids, seed=1, max_predictions=20, **kw):
    return mask_tokens(ids, np.random.default_rng(seed), vocab_size=VOCAB, mask_id=MASK, special_ids=SPECIAL,
                       max_predictions=max_predictions, **kw)


def expected_counts(ids, n, max_predictions, prob=0.15):
    candidates = (~np.isin(ids, SPECIAL)).sum(1)
    return np.minimum(np.minimum(max_predictions, np.maximum(1, np.rint(prob * n))), candidates).astype(int)


def test_counts_rate_and_bookkeeping():
    ids, n = batch()
    assert n.sum() >= 100_000
    out = mask(ids)
    w = out["masked_weights"]
    count = w.sum(1).astype(int)
    np.testing.assert_array_equal(count, expected_counts(ids, n, 20))
    assert abs(count.sum() / n.sum() - 0.15) < 0.01
    # weights are a prefix of ones; positions strictly ascending there, zero after
    np.testing.assert_array_equal(w, (np.arange(20) < count[:, None]).astype(np.float32))
    assert w.dtype == np.float32 and out["masked_positions"].dtype == np.int32 and out["masked_ids"].dtype == np.int32
    pos = out["masked_positions"]
    assert np.all(np.where(w[:, 1:] > 0, np.diff(pos, axis=1) > 0, True))
    assert np.all(pos[w == 0] == 0) and np.all(out["masked_ids"][w == 0] == 0)
    rows = np.arange(len(ids))[:, None]
    np.testing.assert_array_equal(np.where(w > 0, ids[rows, pos], 0), out["masked_ids"])
    assert not np.isin(ids[rows, pos][w > 0], SPECIAL).any()  # never [CLS], [SEP], [PAD]
    # every position not chosen is unchanged
    chosen = np.zeros(ids.shape, bool)
    chosen[np.nonzero(w)[0], pos[w > 0]] = True
    np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])
    assert out["input_ids"].dtype == np.int32


def test_unk_is_maskable_and_rounding_is_half_to_even():
    ids = np.array([[CLS] + [UNK] * 8 + [SEP] + [PAD] * 6], np.int32)  # n = 10: 1.5 rounds to 2
    assert mask(ids)["masked_weights"].sum() == 2
    ids = np.array([[CLS] + [UNK] * 28 + [SEP]], np.int32)  # n = 30: 4.5 rounds to 4, not 5
    assert mask(ids)["masked_weights"].sum() == 4


def test_eighty_ten_ten_of_the_chosen():
    ids, _ = batch()
    out = mask(ids)
    w = out["masked_weights"] > 0
    rows = np.arange(len(ids))[:, None]
    before = ids[rows, out["masked_positions"]][w]
    after = out["input_ids"][rows, out["masked_positions"]][w]
    assert w.sum() > 30_000
    coincide = 0.1 / ALLOWED  # random draws that happen to equal the original
    assert abs(np.mean(after == MASK) - 0.8) < 0.01
    assert abs(np.mean(after == before) - (0.1 + coincide)) < 0.01
    random = (after != MASK) & (after != before)
    assert abs(np.mean(random) - (0.1 - coincide)) < 0.01
    assert not np.isin(after[random], SPECIAL).any()
    assert set(after[random].tolist()) == set(range(VOCAB)) - set(SPECIAL)  # uniform over the non-special ids


def test_other_rates_are_honoured():
    ids, _ = batch(rows=1000)
    out = mask(ids, mask_prob=0.0, random_prob=1.0)
    after = out["input_ids"][np.arange(len(ids))[:, None], out["masked_positions"]][out["masked_weights"] > 0]
    assert not (after == MASK).any()
    out = mask(ids, mask_prob=1.0, random_prob=0.0)
    after = out["input_ids"][np.arange(len(ids))[:, None], out["masked_positions"]][out["masked_weights"] > 0]
    assert (after == MASK).all()


def test_max_predictions_caps_long_rows():
    ids, n = batch(rows=2000)
    out = mask(ids, max_predictions=5)
    count = out["masked_weights"].sum(1)
    uncapped = np.maximum(1, np.rint(0.15 * n))
    assert (uncapped > 5).sum() > 500
    np.testing.assert_array_equal(count, expected_counts(ids, n, 5))
    assert np.all(count[uncapped > 5] == 5)
    assert out["masked_positions"].shape == (2000, 5)


def test_prediction_slots_wider_than_the_row_and_rows_without_candidates():
    ids = np.array([[CLS, 7, 8, SEP], [CLS, SEP, PAD, PAD]], np.int32)
    out = mask(ids, max_predictions=6, masked_lm_prob=1.0)
    np.testing.assert_array_equal(out["masked_positions"], [[1, 2, 0, 0, 0, 0], [0] * 6])
    np.testing.assert_array_equal(out["masked_weights"].sum(1), [2, 0])


def test_positions_are_uniform_over_candidates():
    ids = np.array([[CLS] + [9] * 20 + [SEP]] * 20000, np.int32)
    out = mask(ids, max_predictions=3)  # n = 22 -> 3 per row
    hits = np.bincount(out["masked_positions"].ravel(), minlength=22)
    assert hits[0] == 0 and hits[21] == 0
    expected = 20000 * 3 / 20
    assert np.all(np.abs(hits[1:21] - expected) < 5 * np.sqrt(expected))


def test_same_seed_same_output_other_seed_differs():
    ids, _ = batch(rows=500)
    a, b, c = mask(ids, seed=3), mask(ids, seed=3), mask(ids, seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])
    assert not np.array_equal(a["input_ids"], c["input_ids"])


def test_input_is_not_modified():
    ids, _ = batch(rows=100)
    copy = ids.copy()
    mask(ids)
    np.testing.assert_array_equal(ids, copy)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(input_ids=np.zeros(8, np.int32)), "shape"),
        (dict(special_ids=(CLS, SEP, MASK)), "pad_id 0"),
        (dict(max_predictions=0), "max_predictions=0"),
        (dict(mask_prob=0.95, random_prob=0.1), "masking rates"),
        (dict(vocab_size=1), "no random token"),
    ],
)
def test_bad_input_is_a_user_error(kw, message):
    args = dict(input_ids=batch(rows=2)[0], vocab_size=VOCAB, mask_id=MASK, special_ids=SPECIAL, max_predictions=5)
    args.update(kw)
    with pytest.raises(UserError, match=message):
        mask_tokens(args.pop("input_ids"), np.random.default_rng(0), **args)
