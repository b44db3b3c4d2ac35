"""Downstream metrics against values worked out by hand, including the official edge cases."""

import json

import numpy as np
import pytest

from bertology.evaluation import classification as cls
from bertology.evaluation import conll, outputs, squad


def test_binary_metrics_by_hand():
    pred, gold = [1, 1, 0, 0, 1], [1, 0, 0, 0, 1]  # tp 2, fp 1, tn 2, fn 0
    assert cls.accuracy(pred, gold) == pytest.approx(0.8)
    assert cls.f1_binary(pred, gold) == pytest.approx(2 * 2 / (3 + 2))
    assert cls.matthews_corrcoef(pred, gold) == pytest.approx((2 * 2 - 1 * 0) / np.sqrt(3 * 2 * 3 * 2))
    assert cls.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # a constant prediction
    assert cls.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert cls.f1_binary([0, 0], [0, 0]) == 0.0


def test_correlations_by_hand():
    # dx = (-1, 0, 1), dy = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9)
    assert cls.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / np.sqrt(2 * 114 / 9))
    np.testing.assert_allclose(cls.ranks([3, 1, 2, 2]), [4, 1, 2.5, 2.5])
    # ranks (1, 2.5, 2.5, 4) vs (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5)
    assert cls.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / np.sqrt(4.5 * 5))
    assert cls.spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(1.0)


def test_squad_normalisation_edge_cases():
    assert squad.normalize_answer("The  Cat's, an apple!") == "cats apple"
    assert squad.normalize_answer("Theater") == "theater"  # articles only as whole words
    assert squad.normalize_answer("A") == ""
    assert squad.exact_match("the Eiffel tower.", "Eiffel Tower") == 1.0
    # pred {big, red, dog} vs gold {red, dog, barked}: 2 shared -> P = R = 2/3
    assert squad.f1("the big red dog", "red dog barked") == pytest.approx(2 / 3)
    assert squad.f1("red red", "red") == pytest.approx(2 * 0.5 * 1 / 1.5)  # counts clip
    # v1.1 scores an empty side 0; v2.0 scores 1 when both are empty
    assert squad.f1("", "") == 0.0
    assert squad.f1("", "", version="v2.0") == 1.0
    assert squad.f1("x", "", version="v2.0") == 0.0


def test_squad_evaluate_several_golds_no_answer_and_missing():
    gold = {"q1": ["Denver Broncos", "the Denver Broncos"], "q2": [], "q3": ["1990"], "q4": ["an"]}
    preds = {"q1": "Broncos", "q2": "", "q4": ""}  # q3 has no prediction: scores 0
    out = squad.evaluate(gold, preds, "v2.0")
    # q1: F1 2/3 (P 1, R 1/2), EM 0; q2 is no-answer: 1; q4's only answer normalises away, so its
    # gold is "" and "" scores 1 -- but it still counts under HasAns (its answer list is non-empty)
    assert out["exact"] == pytest.approx(100 * 2 / 4)
    assert out["f1"] == pytest.approx(100 * (2 / 3 + 2) / 4)
    assert out["HasAns_total"] == 3 and out["HasAns_f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)
    assert out["NoAns_total"] == 1 and out["NoAns_exact"] == 100.0
    v1 = squad.evaluate({"q1": ["Denver Broncos", "Broncos"]}, {"q1": "the broncos"}, "v1.1")
    assert v1 == {"exact": 100.0, "f1": 100.0, "total": 1}


def test_conll_chunks_follow_conlleval():
    # I- without B- opens an entity (IOB1); B- after I- of the same type starts a new one
    assert conll.chunks(["O", "I-PER", "I-PER", "I-LOC", "B-LOC", "O"]) == [(1, 2, "PER"), (3, 3, "LOC"), (4, 4, "LOC")]
    assert conll.chunks(["B-PER", "I-ORG"]) == [(0, 0, "PER"), (1, 1, "ORG")]  # type change
    assert conll.chunks(["S-PER", "B-ORG", "E-ORG", "S-ORG"]) == [(0, 0, "PER"), (1, 2, "ORG"), (3, 3, "ORG")]
    assert conll.chunks(["B-MISC", "I-MISC"]) == [(0, 1, "MISC")]  # closed at the sentence end


def test_conll_entity_f1():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"]]
    pred = [["I-PER", "I-PER", "O", "I-ORG"], ["O", "O"]]  # PER right, LOC typed ORG, ORG missed
    out = conll.entity_scores(gold, pred)
    assert out["precision"] == pytest.approx(50.0) and out["recall"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(2 * 50 * (100 / 3) / (50 + 100 / 3))


def test_writers(tmp_path):
    path = outputs.write_glue_tsv(tmp_path / "STS-B.tsv", [0, 1], [4.25, 0.5])
    assert path.read_text() == "index\tprediction\n0\t4.250\n1\t0.500\n"
    outputs.write_glue_tsv(tmp_path / "MNLI-m.tsv", [7], ["entailment"])
    assert (tmp_path / "MNLI-m.tsv").read_text() == "index\tprediction\n7\tentailment\n"
    outputs.write_squad_json(tmp_path / "p.json", {"a": "", "b": "Paris"})
    assert json.loads((tmp_path / "p.json").read_text()) == {"a": "", "b": "Paris"}
    table = outputs.summary_table([
        {"task": "sst2", "scores": {"accuracy": 91.234}},
        {"task": "cola", "init_checkpoint": "runs/x", "mode": "adapters", "scores": {"mcc": 50.0}},
    ])
    assert table.splitlines() == [
        "| task | init | mode | accuracy | mcc |",
        "|---|---|---|---|---|",
        "| sst2 | scratch | full | 91.23 |  |",
        "| cola | runs/x | adapters |  | 50.00 |",
    ]
