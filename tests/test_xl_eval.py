"""Transformer-XL evaluated with a longer memory than it trained with (the config's `eval` block,
as the reference evaluates): the longer memory is really attended, and a run's checkpoint
re-evaluated with it gives another finite perplexity, equal to what the run's own evaluation
with the same block reports."""

import json

import flax.linen as nn
import helpers
import jax
import numpy as np
import pytest

from bertology import models, validation
from bertology.errors import UserError

L = 8  # segment length


def _segments_logits(params, model_config, segments: list[np.ndarray]) -> list[np.ndarray]:
    """Each segment's logits, the memory carried from one to the next from none."""
    model = models.build(model_config)
    carry, out = None, []
    for ids in segments:
        batch = {"input_ids": ids, **({} if carry is None else {"carry": carry})}
        result = model.apply({"params": params}, batch)
        out.append(np.asarray(result["logits"]))
        carry = result["carry"]
    return out


@pytest.mark.parametrize("same_length", [False, True])
def test_a_longer_memory_reaches_back_further(same_length):
    """A 1-layer Transformer-XL's memory is its embeddings of the segments before: with mem_len L
    segment 3 sees only segment 2, so changing segment 1 leaves its logits as they were; with
    mem_len 2L (the same parameters) it sees segment 1 too, and they change."""
    c = helpers.config("transfo_xl", "tiny")
    c.model.update(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=60, mem_len=L,
                   dropout_rate=0.0, attention_dropout_rate=0.0, activation_dropout_rate=0.0)
    rng = np.random.default_rng(0)
    segments = [rng.integers(0, 60, (2, L)).astype(np.int32) for _ in range(3)]
    params = nn.meta.unbox(models.build(c.model).init(jax.random.PRNGKey(0), {"input_ids": segments[0]})["params"])
    changed = [(segments[0] + 7) % 60, *segments[1:]]
    longer = c.model.to_dict() | {"mem_len": 2 * L, "same_length": same_length}
    for block, reaches in ((c.model.to_dict(), False), (longer, True)):
        base, other = _segments_logits(params, block, segments), _segments_logits(params, block, changed)
        assert np.abs(other[1] - base[1]).max() > 1e-5  # segment 2 sees segment 1 with either memory
        gap = np.abs(other[2] - base[2]).max()
        if reaches:
            assert gap > 1e-5, gap  # far above float32 noise; the unchanged case is exactly 0
        else:
            assert gap == 0, gap


def _run_config(steps: int, **eval_block):
    c = helpers.config("transfo_xl", "tiny")
    c.update(batch_size=8, total_steps=steps, log_every=1, eval_every=steps, eval_batches=4, checkpoint_every=steps,
             seed=3)
    c.model.update(num_layers=1, hidden_size=64, num_heads=2, intermediate_size=128, max_position_embeddings=16,
                   mem_len=16)
    c.data.max_seq_length = 16
    c.optimizer.update(learning_rate=3e-3, warmup_steps=2)
    c.eval.update(eval_block)
    return c


def test_checkpoint_reevaluated_with_a_longer_memory(tmp_path):
    """A run trained with mem_len 16 and evaluated at its end with eval.mem_len 64 (same_length):
    `evaluate` on its checkpoint reproduces that evaluation; with the training memory (unset, or
    set to the training value) it gives another finite perplexity, and without memory a third."""
    from bertology.train.loop import evaluate, train

    longer = dict(mem_len=64, same_length=True, clamp_len=48)
    train(_run_config(6, **longer), tmp_path)
    during = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    during = [row for row in during if "eval_perplexity" in row][-1]
    again = evaluate(_run_config(6, **longer), tmp_path)
    np.testing.assert_allclose(again["perplexity"], during["eval_perplexity"], rtol=1e-6)
    trained = evaluate(_run_config(6), tmp_path)
    assert evaluate(_run_config(6, mem_len=16), tmp_path) == trained
    none = evaluate(_run_config(6, mem_len=0), tmp_path)
    ppl = [again["perplexity"], trained["perplexity"], none["perplexity"]]
    assert np.isfinite(ppl).all() and len(set(ppl)) == 3, ppl
    assert 1 < min(ppl) and max(ppl) < 8192 * 2  # a model near its start: below ~uniform over the vocabulary


def test_evaluate_refuses_a_workdir_without_a_run(tmp_path):
    from bertology.train.loop import evaluate

    with pytest.raises(UserError, match="no config.json"):
        evaluate(_run_config(2), tmp_path)


@pytest.mark.parametrize("key,value,match", [
    ("mem_len", -1, "eval.mem_len=-1 is not an integer >= 0"),
    ("clamp_len", -2, "eval.clamp_len=-2 is not an integer >= -1"),
])
def test_bad_eval_values_are_refused(key, value, match):
    c = _run_config(2)
    c.eval[key] = value
    with pytest.raises(UserError, match=match):
        validation.check(c)


def test_same_length_without_memory_and_foreign_keys_are_refused():
    c = _run_config(2, mem_len=0, same_length=True)
    with pytest.raises(UserError, match="eval.same_length=True needs memory at evaluation"):
        validation.check(c)
    c = helpers.config("xlnet", "tiny")
    c.eval.same_length = True
    with pytest.raises(UserError, match="eval.same_length=True is not a setting of this xlnet model"):
        validation.check(c)
    validation.check(_run_config(2, mem_len=32, same_length=True, clamp_len=-1))
