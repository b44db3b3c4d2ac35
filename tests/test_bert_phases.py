"""BERT's two-phase schedule (configs/bert.py:<size>_phase1 then _phase2 on one workdir): the
second phase resumes the first at its last step with longer rows and finishes one learning-rate
schedule, as Devlin et al. 2019 (A.2) train 90% of the steps at 128 tokens and the rest at 512."""

import json
import sys

import pytest
from helpers import REPO

from bertology.train import optimizer as optimizer_lib


def phase(name, steps, **data):
    sys.path.insert(0, str(REPO / "configs"))
    import bert

    c = bert.get_config("tiny")
    c.total_steps = steps
    c = bert.two_phases(c, name)
    c.batch_size, c.log_every, c.eval_every, c.checkpoint_every, c.mesh.shape = 8, 1, 0, 1000, (1, 1)
    c.optimizer.warmup_steps = 2
    c.data.update(data)
    return c


def test_the_phases_split_one_run_at_ninety_percent():
    one, two = phase("phase1", 1000), phase("phase2", 1000)
    assert (one.total_steps, one.optimizer.schedule_steps, one.data.max_seq_length) == (900, 1000, 128)
    assert (two.total_steps, two.optimizer.schedule_steps, two.data.max_seq_length, two.data.max_predictions_per_seq) == \
        (1000, 1000, 512, 80)
    assert set(two.allow_config_change.split(",")) == {"total_steps", "data.max_seq_length", "data.max_predictions_per_seq"}


@pytest.mark.slow
def test_phase_two_resumes_phase_one_with_longer_rows_on_the_same_schedule(tmp_path):
    from bertology.train.loop import train

    first = phase("phase1", 20, max_seq_length=32, max_predictions_per_seq=5)
    train(first, tmp_path)
    second = phase("phase2", 20, max_seq_length=64, max_predictions_per_seq=10)  # 512/80 at full size
    train(second, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "learning_rate" in r]
    assert steps == list(range(1, 21))  # phase 1 to 18 (90%), phase 2 from 19 on, no step twice
    schedule = optimizer_lib.schedule(first.optimizer, first.total_steps)
    lrs = [r["learning_rate"] for r in rows if "learning_rate" in r]
    offset = 0 if lrs[0] == pytest.approx(float(schedule(0)), rel=1e-5) else 1  # the step's own rate, or the next
    assert lrs == pytest.approx([float(schedule(s - 1 + offset)) for s in steps], rel=1e-5)  # one schedule throughout
    assert json.loads((tmp_path / "config.json").read_text())["data"]["max_seq_length"] == 64
