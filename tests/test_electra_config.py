"""ELECTRA's masked-prediction cap follows its masking rate and row length, as the reference's
`configure_pretraining.py` derives it after every hyperparameter override:
`max_predictions_per_seq = int((mask_prob + 0.005) * max_seq_length)`; and `validation.check`
refuses a config whose cap cuts the masking rate it asks for."""

from __future__ import annotations

import json

import ml_collections
import pytest
from etils import epath
from helpers import REPO

from bertology import cli, sweep, validation
from bertology.errors import UserError
from bertology.train.run import check_config_drift, write_config

ELECTRA = REPO / "configs" / "electra.py"


def reference_cap(masked_lm_prob: float, max_seq_length: int) -> int:
    return int((masked_lm_prob + 0.005) * max_seq_length)


def cli_config(*argv: str) -> ml_collections.ConfigDict:
    """The config `bertology.cli` hands an entry point: `--config` loaded, `--config.*` applied."""
    seen = []
    code = cli.run("test", lambda fv: seen.append(fv.config), argv=["test", *argv])
    assert code == 0 and len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("preset", ["tiny", "small", "base", "large", "large_15", "large_replace_mlm",
                                    "large_all_tokens_mlm"])
def test_cap_is_the_references_after_the_preset_sets_the_rate(preset):
    c = sweep.load_config(ELECTRA, preset)
    rate = 0.25 if preset.startswith("large") else 0.15
    length = 128 if preset in ("tiny", "small") else 512
    assert (c.data.masked_lm_prob, c.data.max_seq_length) == (rate, length)
    assert c.data.max_predictions_per_seq == reference_cap(rate, length)


def test_large_masks_a_quarter_of_512_tokens():
    """The bug: the cap was fixed at 15% before `large` raised the rate to 25% (79, not 130)."""
    c = sweep.load_config(ELECTRA, "large")
    assert c.data.max_predictions_per_seq == int((0.25 + 0.005) * 512) == 130
    validation.check(c)


def test_overriding_the_rate_or_length_on_a_loaded_config_moves_the_cap():
    c = sweep.load_config(ELECTRA, "large")
    c.data.masked_lm_prob = 0.2
    assert c.data.max_predictions_per_seq == reference_cap(0.2, 512) == 104
    c.data.max_seq_length = 256
    assert c.data.max_predictions_per_seq == reference_cap(0.2, 256) == 52


@pytest.mark.parametrize("overrides, rate, length", [
    (("--config.data.masked_lm_prob=0.2",), 0.2, 512),
    (("--config.data.max_seq_length=256",), 0.25, 256),
    (("--config.data.max_seq_length=256", "--config.data.masked_lm_prob=0.3"), 0.3, 256),
])
def test_command_line_overrides_move_the_cap(overrides, rate, length):
    c = cli_config("--config=configs/electra.py:large", *overrides)
    assert (c.data.masked_lm_prob, c.data.max_seq_length) == (rate, length)
    assert c.data.max_predictions_per_seq == reference_cap(rate, length)
    validation.check(c)


@pytest.mark.parametrize("overrides", [
    ("--config.data.max_predictions_per_seq=140", "--config.data.masked_lm_prob=0.2"),
    ("--config.data.masked_lm_prob=0.2", "--config.data.max_predictions_per_seq=140"),
])
def test_a_cap_set_explicitly_stays_whatever_else_changes(overrides):
    c = cli_config("--config=configs/electra.py:large", *overrides)
    assert (c.data.masked_lm_prob, c.data.max_predictions_per_seq) == (0.2, 140)
    c.data.max_seq_length = 256
    assert c.data.max_predictions_per_seq == 140


def test_config_json_holds_the_resolved_cap_and_a_resume_compares_it(tmp_path):
    """config.json (what fine-tuning, export and the resume check read) holds plain numbers; an
    identical config resumes, and a changed rate is drift in both keys."""
    c = cli_config("--config=configs/electra.py:large", "--config.data.masked_lm_prob=0.2")
    write_config(c, epath.Path(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())["data"]
    assert (saved["masked_lm_prob"], saved["max_predictions_per_seq"]) == (0.2, 104)
    assert ml_collections.ConfigDict(saved).max_predictions_per_seq == 104
    check_config_drift(cli_config("--config=configs/electra.py:large", "--config.data.masked_lm_prob=0.2"),
                       epath.Path(tmp_path))
    drift = r"data\.masked_lm_prob 0\.2 -> 0\.25.*data\.max_predictions_per_seq 104 -> 130"
    with pytest.raises(UserError, match=drift):
        check_config_drift(cli_config("--config=configs/electra.py:large"), epath.Path(tmp_path))


# --- validation: the cap must not cut the masking rate ----------------------------------------------

def _refusal(config: ml_collections.ConfigDict) -> str:
    with pytest.raises(UserError) as e:
        validation.check(config)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_rate_the_cap_cuts_is_refused_naming_both_keys_and_the_fix():
    c = sweep.load_config(REPO / "configs" / "bert.py", "tiny")
    assert (c.data.max_seq_length, c.data.max_predictions_per_seq) == (128, 20)
    c.data.masked_lm_prob = 0.5
    message = _refusal(c)
    assert message.startswith("data.masked_lm_prob=0.5 ")
    assert "data.max_predictions_per_seq=20" in message and "data.max_seq_length=128" in message
    assert "--config.data.max_predictions_per_seq" in message and "at least 64" in message  # round(0.5 · 128)


def test_electra_large_with_the_old_cap_is_refused():
    c = sweep.load_config(ELECTRA, "large")
    c.data.max_predictions_per_seq = int((0.15 + 0.005) * 512)  # 79: what the preset used to ship
    assert "at least 128" in _refusal(c)  # round(0.25 · 512)


def test_the_cap_may_equal_the_rounded_rate():
    """round(p · L) predictions fill a full row (Python's rounding, as masking.py's np.rint)."""
    c = sweep.load_config(REPO / "configs" / "bert.py", "tiny")
    c.data.max_seq_length, c.data.max_predictions_per_seq = 512, 77  # round(76.8): BERT's 512 recipes
    validation.check(c)
    c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5  # round(4.8)
    validation.check(c)
    c.data.max_predictions_per_seq = 4
    _refusal(c)


def test_span_masking_has_the_same_budget():
    """Whole-word, n-gram and span units are chosen within the same budget (`masking.prepare`)."""
    c = sweep.load_config(REPO / "configs" / "spanbert.py", "tiny")
    c.data.masked_lm_prob = 0.3
    assert "at least 38" in _refusal(c)  # round(0.3 · 128)


@pytest.mark.parametrize("path, arg", [("gpt.py", "gpt2"), ("t5.py", "base"), ("bart.py", "large"),
                                       ("xlnet.py", "large"), ("transfo_xl.py", "base"), ("mass.py", "base")])
def test_objectives_that_do_not_mask_with_the_budget_are_not_refused(path, arg):
    """These configs inherit the MLM keys from `recipes.pretraining` but their transforms never read them."""
    c = sweep.load_config(REPO / "configs" / path, arg)
    c.mesh.shape = (1, 1)  # Transformer-XL base's batch of 60 does not divide over the 8 test devices
    assert round(c.data.masked_lm_prob * c.data.max_seq_length) > c.data.max_predictions_per_seq
    validation.check(c)


def test_a_reference_that_caps_on_purpose_opts_in():
    """ALBERT's reference pretrains at length 512 with max_predictions_per_seq=20 (its README's
    run_pretraining flags): the preset says so, and without that the config is refused."""
    c = sweep.load_config(REPO / "configs" / "albert.py", "base")
    assert (c.data.max_seq_length, c.data.max_predictions_per_seq) == (512, 20)
    assert c.data.allow_capped_predictions is True
    validation.check(c)
    c.data.allow_capped_predictions = False
    assert "at least 77" in _refusal(c)
    raw = c.to_dict()
    raw["data"]["allow_capped_predictions"] = "yes"  # a hand-built config: ConfigDict's own type check is bypassed
    refusal = _refusal(ml_collections.ConfigDict(raw))
    assert refusal.startswith("data.allow_capped_predictions='yes' is not True or False")
