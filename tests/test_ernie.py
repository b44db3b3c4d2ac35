"""ERNIE 1.0's multi-stage knowledge masking (configs/ernie.py): basic, phrase and entity masking
in turn on one workdir and one learning-rate schedule (Sun et al. 2019, §3.2)."""

import sys

import numpy as np
import pytest
from etils import epath
from helpers import REPO

from bertology.data import transforms
from bertology.data.embedded import LEXICONS
from bertology.data.lexicon import LexiconMatcher
from bertology.data.tokenizers import for_data
from bertology.errors import UserError
from bertology.train.run import check_config_drift, write_config

STAGES = ("basic", "phrase", "entity")


def stage(name, steps):
    sys.path.insert(0, str(REPO / "configs"))
    import ernie

    c = ernie.get_config("tiny")
    c.total_steps = steps
    c = ernie.staged(c, name)
    c.batch_size, c.log_every, c.eval_every, c.checkpoint_every, c.mesh.shape = 4, 1, 0, 1000, (1, 1)
    c.optimizer.warmup_steps = 2
    c.data.update(max_seq_length=32, max_predictions_per_seq=6)
    return c


def test_the_stages_split_one_run_in_thirds_each_with_its_masking():
    configs = [stage(name, 900) for name in STAGES]
    assert [(c.total_steps, c.optimizer.schedule_steps) for c in configs] == [(300, 900), (600, 900), (900, 900)]
    assert [(c.data.mask_unit, c.data.lexicon) for c in configs] == [
        ("whole_word", None), ("entity", "phrases"), ("entity", "entities")]
    assert configs[0].allow_config_change == ""
    for c in configs[1:]:
        assert set(c.allow_config_change.split(",")) == {"total_steps", "data.mask_unit", "data.lexicon"}


def test_each_stage_masks_its_units_whole():
    """A sentence with two phrases and two entities, masked 300 times by each stage's transform:
    a stage's own units are masked whole or not at all (and some are masked); the other stage's
    units are split by its masking (the control that shows the check can fail)."""
    sentence = "the sys.path list and the os.environ mapping are part of the standard library with a regular expression module"
    partial, whole = {}, {}
    for name in STAGES:
        c = stage(name, 900)
        tok = for_data(c.data)
        row = [tok.cls_id, *tok.encode(sentence), tok.sep_id]
        ids = np.array([row] * 300, np.int32)
        units = {kind: LexiconMatcher(LEXICONS[kind], tok).spans(ids[0]) for kind in ("phrases", "entities")}
        assert [tok.decode(ids[0, a:b].tolist()) for a, b in units["entities"]] == ["sys . path", "os . environ"]
        assert [tok.decode(ids[0, a:b].tolist()) for a, b in units["phrases"]] == ["standard library", "regular expression"]
        out = transforms.make(c.data, tok).corrupt({"input_ids": ids}, np.random.default_rng(0))
        for kind, spans in units.items():
            partial[name, kind] = whole[name, kind] = 0
            for r in range(len(ids)):
                chosen = set(out["masked_positions"][r][out["masked_weights"][r] > 0].tolist())
                for a, b in spans:
                    hit = len(chosen & set(range(a, b)))
                    partial[name, kind] += 0 < hit < b - a
                    whole[name, kind] += hit == b - a
    assert partial["phrase", "phrases"] == 0 and whole["phrase", "phrases"] > 30
    assert partial["entity", "entities"] == 0 and whole["entity", "entities"] > 30
    assert partial["phrase", "entities"] > 10 and partial["entity", "phrases"] > 10
    assert partial["basic", "phrases"] > 10 and partial["basic", "entities"] > 10


def test_each_stage_resumes_the_last_and_nothing_else_may_change(tmp_path):
    """The workdir's config.json is the last stage's: the next stage's masking keys and its
    total_steps are the changes it may make; a change to anything else is still refused."""
    workdir = epath.Path(tmp_path)
    for before, after in zip(STAGES, STAGES[1:]):
        write_config(stage(before, 900), workdir)
        check_config_drift(stage(after, 900), workdir)
        bigger = stage(after, 900)
        bigger.data.max_seq_length = 64
        with pytest.raises(UserError, match="data.max_seq_length 32 -> 64"):
            check_config_drift(bigger, workdir)
