"""StructBERT (Wang et al. 2020): the word structural objective's shuffled trigrams, the three
sentence-structure labels, and a tiny run of all three terms."""

import json

import numpy as np
import pytest
from test_examples import BASE, CLS, DOC, SEP, corpus

from bertology.data.examples import create_pair_instances
from bertology.families.structbert.data import shuffle_trigrams

PAD, MASK = 0, 3


def masked_rows(rng, rows=6, length=40, slots=20):
    """Rows `[CLS] tokens [SEP] pad` with a few masked slots, as `mask_tokens` returns them."""
    ids = np.full((rows, length), PAD, np.int32)
    mask = np.zeros_like(ids)
    positions = np.zeros((rows, slots), np.int32)
    targets, weights = np.zeros_like(positions), np.zeros((rows, slots), np.float32)
    for r in range(rows):
        n = 20 + 3 * r
        ids[r, :n] = [CLS, *rng.integers(100, 200, n - 2), SEP]
        mask[r, :n] = 1
        chosen = np.sort(rng.choice(np.arange(1, n - 1), 3, replace=False))
        positions[r, :3], targets[r, :3], weights[r, :3] = chosen, ids[r, chosen], 1.0
        ids[r, chosen] = MASK
    return {"input_ids": ids, "input_mask": mask, "masked_positions": positions, "masked_ids": targets,
            "masked_weights": weights}


@pytest.mark.parametrize("fraction", [0.05, 1.0])
def test_shuffled_trigrams_are_unmasked_permuted_and_predicted(fraction):
    rng = np.random.default_rng(0)
    batch = masked_rows(rng)
    out = shuffle_trigrams(batch, np.random.default_rng(1), fraction=fraction, special_ids=[PAD, CLS, SEP, MASK])
    for r in range(len(out["input_ids"])):
        w, s = out["masked_weights"][r] > 0, out["shuffled"][r] > 0
        assert (np.diff(out["masked_positions"][r][w]) > 0).all()  # the slots in ascending position
        before = {int(p) for p in batch["masked_positions"][r][batch["masked_weights"][r] > 0]}
        assert {int(p) for p in out["masked_positions"][r][w & ~s]} == before  # the masked slots kept
        spans = out["masked_positions"][r][s].reshape(-1, 3)
        real = batch["input_mask"][r].sum()
        starts = [p for p in range(1, real - 3) if not before & {p, p + 1, p + 2}]
        if fraction < 1:  # 5% of the row's candidate trigrams, at least one
            assert len(spans) == max(1, round(fraction * len(starts)))
        for span, original in zip(spans, out["masked_ids"][r][s].reshape(-1, 3)):
            assert (np.diff(span) == 1).all() and not before & set(span.tolist())  # a trigram, none of it masked
            assert (original == batch["input_ids"][r][span]).all()  # predicts the tokens that were there
            got = out["input_ids"][r][span]
            assert sorted(got) == sorted(original) and (len(set(original)) < 3 or (got != original).any())
        assert int(w.sum()) <= out["masked_weights"].shape[1]
    untouched = ~(out["shuffled"] > 0).any(1)
    np.testing.assert_array_equal(out["input_ids"][untouched], batch["input_ids"][untouched])
    if fraction == 1.0:  # at most what the 17 free slots hold, 5 trigrams; the longest rows find them all
        assert (out["shuffled"].sum(1) <= 15).all() and (out["shuffled"].sum(1)[-2:] == 15).all()


def test_three_sentence_labels_follow_precede_and_random():
    docs, _ = corpus(n_docs=150)
    inst = create_pair_instances(docs, max_seq_length=128, short_seq_prob=0.0, cls_id=CLS, sep_id=SEP,
                                 rng=np.random.default_rng(0), sentence_structure=True)
    shares = np.bincount(inst.next_sentence_label, minlength=3) / len(inst.next_sentence_label)
    assert (np.abs(shares - 1 / 3) < 0.08).all(), shares
    for ids, seg, label, da, db in zip(inst.input_ids, inst.segment_ids, inst.next_sentence_label, inst.doc_a, inst.doc_b):
        a = [int(t) for t in ids[1:][seg[1:] == 0] if t >= BASE]
        b = [int(t) for t in ids[seg == 1] if t >= BASE]
        if label == 2:
            assert da != db
        else:
            assert da == db and (b[0] - BASE) % DOC > (a[-1] - BASE) % DOC if label == 0 else (a[0] - BASE) % DOC > \
                (b[-1] - BASE) % DOC  # 1: B precedes A (the true pair swapped)


@pytest.mark.slow
def test_tiny_structbert_trains_its_three_terms(tmp_path):
    import helpers

    from bertology.train.loop import train

    c = helpers.config("structbert", "tiny")
    c.batch_size, c.total_steps, c.log_every, c.eval_every, c.checkpoint_every = 16, 40, 1, 0, 1000
    c.data.max_seq_length, c.data.max_predictions_per_seq, c.mesh.shape = 64, 20, (1, 1)
    train(c, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    for key in ("mlm_loss", "wso_loss"):  # the shuffled tokens are predicted better as the MLM head learns
        first, last = np.mean([r[key] for r in rows[:5]]), np.mean([r[key] for r in rows[-5:]])
        assert last < first, (key, first, last)
    # three classes at chance (ln 3), not NSP's two (ln 2); telling order apart takes longer than 40 steps
    assert abs(np.mean([r["sso_loss"] for r in rows[:5]]) - np.log(3)) < 0.1
    for r in rows:
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["wso_loss"] + r["sso_loss"], rel=1e-5)
