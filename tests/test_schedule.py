"""Learning-rate schedules: BERT's linear decay and GPT's cosine, against their closed forms."""

import math

import ml_collections
import pytest

from bertology.errors import UserError
from bertology.train.optimizer import schedule


def _cfg(**kw):
    return ml_collections.ConfigDict(dict(learning_rate=6e-4, warmup_steps=20, **kw))


def test_cosine_decays_to_the_end_fraction_after_linear_warmup():
    f = schedule(_cfg(schedule="cosine", end_learning_rate_fraction=0.1), 220)
    for step in (0, 7, 20, 57, 120, 199, 220):
        if step < 20:
            want = 6e-4 * step / 20
        else:
            progress = (step - 20) / 200
            want = 6e-5 + (6e-4 - 6e-5) * 0.5 * (1 + math.cos(math.pi * progress))
        assert float(f(step)) == pytest.approx(want, rel=1e-5, abs=1e-12)


def test_linear_is_the_default_and_unknown_kinds_are_refused():
    f = schedule(_cfg(), 120)
    assert float(f(70)) == pytest.approx(6e-4 * 50 / 100)
    assert float(f(120)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(UserError, match="schedule"):
        schedule(_cfg(schedule="step"), 100)


def test_schedule_steps_sets_the_horizon_so_a_short_run_follows_the_long_one():
    long, short = schedule(_cfg(), 120), schedule(_cfg(schedule_steps=120), 30)
    assert [float(short(s)) for s in range(31)] == [float(long(s)) for s in range(31)]
    assert float(short(30)) == pytest.approx(6e-4 * 90 / 100)  # not yet decayed to 0 at its own end
