"""Quick-Thought (Logeswaran & Lee 2018): rows of consecutive sentences, the neighbour classifier
against a numpy reference, a tiny model that learns to pick a batch's neighbours, and fine-tuning
that reads both encoders."""

import sys

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import REPO
from scipy.special import log_softmax

from bertology import models, objectives, validation
from bertology.data import transforms
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.families.quick_thought.objective import neighbour_scores

TOK = load_tokenizer(DEFAULT_VOCAB)


def config(preset="tiny"):
    sys.path.insert(0, str(REPO / "configs"))
    import quick_thought

    c = quick_thought.get_config(preset)
    c.model.vocab_size = TOK.vocab_size
    return c


def documents(n_docs=6, sentences=11):
    return [[np.arange(100 + 1000 * d + 10 * k, 100 + 1000 * d + 10 * k + 3 + k % 4, dtype=np.int32)
             for k in range(sentences)] for d in range(n_docs)]


def test_rows_hold_consecutive_sentences_of_one_document():
    c = config().data
    rows = transforms.make(c, TOK).instances(documents(), np.random.default_rng(0))
    assert rows["input_ids"].shape == (12, 8, 32)  # 11 sentences: a row of 8, a row of 3 (5 empty slots)
    first = rows["input_ids"][0, :, 1]
    assert (first == 100 + 10 * np.arange(8)).all() and (rows["input_ids"][:, :, 0][rows["input_mask"][:, :, 0] > 0] ==
                                                         TOK.cls_id).all()
    assert rows["input_mask"][1, :, 0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert rows["input_ids"][1, 0, 1] == 180 and rows["input_ids"][2, 0, 1] == 1100  # the next document starts a row
    one = config().data
    one.sentences_per_row = 1
    with pytest.raises(UserError, match="sentences_per_row=1"):
        transforms.make(one, TOK)
    c = config()
    c.grad_accum_steps = 2
    with pytest.raises(UserError, match="grad_accum_steps=2 would split the batch"):
        validation.check(c)


def test_the_loss_is_each_sentences_neighbours_among_the_batch():
    rng = np.random.default_rng(1)
    per_row, rows = 4, 3
    f, g = rng.normal(size=(rows * per_row, 5)), rng.normal(size=(rows * per_row, 5))
    real = np.ones(rows * per_row, bool)
    real[7] = False  # an empty slot: neither a candidate nor a target
    logp, neighbour, hit = map(np.asarray, neighbour_scores(f, g, real, per_row))
    for i in range(rows * per_row):
        if not real[i]:
            continue
        candidates = [j for j in range(rows * per_row) if real[j] and j != i]
        want = log_softmax(f[i] @ g[candidates].T)
        np.testing.assert_allclose(logp[i, candidates], want, rtol=1e-5)
        neighbours = {j for j in (i - 1, i + 1) if 0 <= j < rows * per_row and j // per_row == i // per_row and real[j]}
        assert set(np.flatnonzero(neighbour[i])) == neighbours
        assert hit[i] == (candidates[int(np.argmax(f[i] @ g[candidates].T))] in neighbours)


def test_a_tiny_model_learns_to_pick_the_neighbours():
    c = config()
    rows = transforms.make(c.data, TOK).instances(documents(n_docs=8, sentences=16), np.random.default_rng(0))
    batch = {k: v[:8] for k, v in rows.items()}
    model = models.build(c.model)
    params = nn.meta.unbox(model.init(jax.random.key(0), batch))["params"]
    objective = objectives.get(c.objective)
    tx = optax.adam(1e-3)
    state = tx.init(params)

    @jax.jit
    def step(p, s):
        (loss, m), g = jax.value_and_grad(lambda p: objective(p, batch, None, model), has_aux=True)(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss, m

    losses = []
    for _ in range(40):
        params, state, loss, metrics = step(params, state)
        losses.append(float(loss))
    assert losses[0] == pytest.approx(np.log(63), abs=0.4)  # 63 candidates, none favoured at the start
    assert losses[-1] < losses[0] - 1.0 and float(metrics["qt_accuracy"]) > 0.2


@pytest.mark.slow
def test_fine_tuning_reads_both_encoders(tmp_path):
    """A Quick-Thought run fine-tunes on the SST-2 fixture through both encoders: the trunk holds
    the two pretrained encoders and nothing else, the head reads [f(s); g(s)], the loss falls."""
    from flax.traverse_util import flatten_dict
    from helpers import sst2_from

    from bertology.train.checkpoint import load_params
    from bertology.train.loop import train

    c = config()
    c.model.vocab_size = None
    c.total_steps, c.log_every, c.eval_every, c.checkpoint_every, c.mesh.shape = 4, 1, 0, 1000, (1, 1)
    train(c, tmp_path / "pre")
    result = sst2_from(tmp_path / "pre", tmp_path / "ft", steps=20, max_seq_length=32, drop=0.0)
    pre = flatten_dict(load_params(tmp_path / "pre")[0])
    assert set(flatten_dict(result["params"]["encoder"])) == set(pre)  # every tensor is one of the two encoders
    assert {k[0] for k in pre} == {"encoder", "context_encoder"}
    assert result["params"]["head"]["kernel"].shape[0] == 2 * c.model.hidden_size  # reads [f; g]
