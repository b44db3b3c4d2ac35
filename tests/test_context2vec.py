"""context2vec (Melamud et al. 2016): the context of a slot excludes its word and reads both
sides; the negative-sampling loss against numpy; negatives drawn as word2vec draws them; a tiny
run that learns to pick held-out words and fine-tunes."""

import json
import sys

import jax
import numpy as np
import pytest
from helpers import REPO

from bertology import models, objectives, validation
from bertology.data import transforms
from bertology.errors import UserError
from bertology.families.context2vec.model import words


def config(preset="tiny"):
    sys.path.insert(0, str(REPO / "configs"))
    import context2vec

    return context2vec.get_config(preset)


def tiny(vocab=50):
    c = config()
    c.model.update(vocab_size=vocab, embedding_dim=8, lstm_dim=16, target_dim=12)
    return c


def rows(rng, vocab=50, lengths=(9, 6, 12)):
    """[CLS]=2 ... [SEP]=3 rows of random words, right-padded to 12."""
    ids = np.zeros((len(lengths), 12), np.int32)
    for r, n in enumerate(lengths):
        ids[r, :n] = [2, *rng.integers(5, vocab, n - 2), 3]
    return {"input_ids": ids, "input_mask": (ids > 0).astype(np.int32)}


def test_a_slots_context_excludes_its_word_and_reads_both_sides():
    c = tiny()
    model = models.build(c.model)
    batch = rows(np.random.default_rng(0))
    params = model.init(jax.random.key(0), batch)["params"]
    context = lambda b: np.asarray(model.apply({"params": params}, b)["context"])  # noqa: E731
    base = context(batch)
    i = 4
    for j, reads in ((i, False), (i - 1, True), (i + 1, True), (1, True), (7, True)):
        changed = {**batch, "input_ids": batch["input_ids"].copy()}
        changed["input_ids"][0, j] = 7 if batch["input_ids"][0, j] != 7 else 8
        moved = np.abs(context(changed)[0, i] - base[0, i]).max()
        assert (moved > 1e-6) == reads, (j, moved)
    # Padding behind a row changes no slot: the right-to-left LSTM starts at the row's [SEP].
    wider = {k: np.pad(v, ((0, 0), (0, 5))) for k, v in batch.items()}
    slots = np.asarray(words(batch))
    assert slots.sum() == (9 - 2) + (6 - 2) + (12 - 2)
    np.testing.assert_allclose(context(wider)[:, :12][slots], base[slots], atol=1e-6)


def test_the_loss_is_negative_sampling_against_numpy():
    c = tiny()
    model = models.build(c.model)
    rng = np.random.default_rng(1)
    batch = rows(rng)
    negatives = rng.integers(5, 50, (*batch["input_ids"].shape, 4))
    batch["negatives"] = np.where(negatives == batch["input_ids"][..., None], 4, negatives).astype(np.int32)  # no ties
    params = model.init(jax.random.key(0), batch)["params"]
    params["targets"] = jax.random.normal(jax.random.key(2), params["targets"].shape) * 0.5  # zeros at init
    objective = objectives.get("context2vec")
    means = objective.metrics(objective.terms(params, batch, None, model))
    context = np.asarray(model.apply({"params": params}, batch)["context"], np.float64)
    t = np.asarray(params["targets"], np.float64)
    log_sigmoid = lambda x: -np.logaddexp(0, -x)  # noqa: E731
    nll, hits = [], []
    for r, n in enumerate((9, 6, 12)):
        for i in range(1, n - 1):  # every word; [CLS] and [SEP] are no slots
            pos = context[r, i] @ t[batch["input_ids"][r, i]]
            neg = t[batch["negatives"][r, i]] @ context[r, i]
            nll.append(-log_sigmoid(pos) - log_sigmoid(-neg).sum())
            hits.append(pos > neg.max())
    np.testing.assert_allclose(means["c2v_loss"], np.mean(nll), rtol=1e-5)
    np.testing.assert_allclose(means["c2v_accuracy"], np.mean(hits), rtol=1e-6)


def test_rows_are_sentences_and_negatives_follow_counts_to_the_power():
    c = config()
    c.data.update(max_seq_length=6, negatives=5, ns_power=0.75)

    class Words:  # a 20-word vocabulary: ids 0..4 the specials
        vocab_size, pad_id, cls_id, sep_id = 20, 0, 2, 3
        special_ids = frozenset({0, 1, 2, 3, 4})

    transform = transforms.make(c.data, Words())
    docs = [[np.array([5, 5, 5, 5, 6], np.int32), np.array([7, 5], np.int32)], [np.array([6, 8, 5, 5], np.int32)]]
    inst = transform.instances(docs, np.random.default_rng(0))
    assert inst["input_ids"].tolist() == [[2, 5, 5, 5, 5, 3], [2, 7, 5, 3, 0, 0], [2, 6, 8, 5, 5, 3]]  # cut to fit
    out = transform.corrupt({k: np.repeat(v, 2000, 0) for k, v in inst.items()}, np.random.default_rng(1))
    counts = {5: 7, 6: 1, 7: 1, 8: 1}  # the words of the rows (as cut), specials never drawn
    expected = np.array([counts.get(w, 0) ** 0.75 for w in range(20)])
    drawn = np.bincount(out["negatives"].ravel(), minlength=20) / out["negatives"].size
    np.testing.assert_allclose(drawn, expected / expected.sum(), atol=0.005)
    for key, value, message in (("negatives", 0, "data.negatives=0 must be a positive integer"),
                                ("ns_power", -1.0, "data.ns_power=-1.0 must be >= 0"),
                                ("max_seq_length", 2, "data.max_seq_length=2 leaves no word")):
        bad = config()
        bad.data[key] = value
        with pytest.raises(UserError, match=message):
            validation.check(bad)


@pytest.mark.slow
def test_a_tiny_run_learns_to_complete_sentences_and_fine_tunes(tmp_path):
    """50 steps on the embedded corpus: the loss falls from (1 + 10)·ln 2 (zero targets score
    every word 0). Sentence completion in miniature: for every word of 300 corpus sentences, the
    word must outscore 4 others drawn as negatives are; the contexts of the sentences do so far
    more often than the same contexts shuffled across the slots, so the model reads the context,
    not only how frequent a word is. The run then fine-tunes on SST-2 through its context vectors."""
    from helpers import sst2_from

    from bertology.data.embedded import embedded_corpus_path
    from bertology.data.tokenizers import for_data
    from bertology.train.checkpoint import load_params
    from bertology.train.loop import train

    c = config()
    c.total_steps, c.log_every, c.eval_every, c.checkpoint_every, c.mesh.shape = 50, 1, 0, 1000, (1, 1)
    c.optimizer.warmup_steps = 5
    train(c, tmp_path / "pre")
    metrics = [json.loads(line) for line in (tmp_path / "pre" / "metrics.jsonl").read_text().splitlines()]
    train_loss = [m["c2v_loss"] for m in metrics if "c2v_loss" in m]
    assert train_loss[0] == pytest.approx(11 * np.log(2), abs=0.05)
    assert train_loss[-1] < 0.6 * train_loss[0], train_loss

    c.data.negatives = 4
    tok = for_data(c.data)
    lines = [line for line in embedded_corpus_path().read_text().splitlines() if len(line.split()) >= 8][:300]
    transform = transforms.make(c.data, tok)
    batch = transform.corrupt(transform.instances([[np.asarray(tok.encode(x), np.int32) for x in lines]], None),
                              np.random.default_rng(0))
    c.model.vocab_size = tok.vocab_size
    params = load_params(tmp_path / "pre")[0]
    context = np.asarray(models.build(c.model).apply({"params": params}, batch)["context"])
    slots = np.asarray(words(batch))
    targets = np.asarray(params["targets"])

    def accuracy(ctx):
        true = np.einsum("nd,nd->n", ctx, targets[batch["input_ids"][slots]])
        others = np.einsum("nd,nkd->nk", ctx, targets[batch["negatives"][slots]])
        return np.mean(true > others.max(-1))

    read, shuffled = accuracy(context[slots]), accuracy(np.random.default_rng(1).permutation(context[slots]))
    assert read > shuffled + 0.03 and read > 0.3, (read, shuffled)  # 0.351 vs 0.305 over 4.5k slots when written

    result = sst2_from(tmp_path / "pre", tmp_path / "ft", steps=10, max_seq_length=32, drop=0.0)
    assert result["params"]["head"]["kernel"].shape[0] == c.model.target_dim  # the head reads context vectors
