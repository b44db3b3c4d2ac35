"""`bertology.grid`: learning rates × seeds, medians with their spread, the rate chosen by its
median, finished runs read rather than rerun, and the GLUE score card's arithmetic."""

import json

import pytest
from helpers import tiny

from bertology import grid
from bertology.errors import UserError


def runs(table):
    """[{learning_rate, seed, scores}] from {rate: [accuracy per seed]}."""
    return [{"learning_rate": rate, "seed": s, "scores": {"accuracy": a, "f1": a / 2}}
            for rate, accs in table.items() for s, a in enumerate(accs)]


def test_the_rate_is_chosen_by_its_median_not_its_mean():
    # 3e-5 has the higher mean (one lucky seed), 2e-5 the higher median
    out = grid.summarise(runs({2e-5: [70.0, 71.0, 72.0], 3e-5: [60.0, 61.0, 99.0]}), "accuracy")
    assert out["best_learning_rate"] == 2e-5
    assert out["median"] == {"accuracy": 71.0, "f1": 35.5}
    spread = out["by_learning_rate"]["3e-05"]["accuracy"]
    assert (spread["median"], spread["min"], spread["max"], spread["seeds"]) == (61.0, 60.0, 99.0, [60.0, 61.0, 99.0])
    tie = grid.summarise(runs({5e-5: [80.0, 80.0], 1e-5: [80.0, 80.0]}), "accuracy")
    assert tie["best_learning_rate"] == 1e-5  # a tie goes to the smaller rate
    with pytest.raises(UserError, match="no 'mcc' score"):
        grid.summarise(runs({2e-5: [1.0]}), "mcc")


def test_grid_fine_tunes_every_rate_and_seed_once(tmp_path):
    c = tiny("sst2", "glue/SST-2", total_steps=6)
    out = grid.grid(c, [1e-3, 3e-3], [0, 1], tmp_path)
    assert [(r["learning_rate"], r["seed"]) for r in out["runs"]] == [(1e-3, 0), (1e-3, 1), (3e-3, 0), (3e-3, 1)]
    for r in out["runs"]:
        saved = json.loads((tmp_path / grid.run_name(r["learning_rate"], r["seed"]) / "config.json").read_text())
        assert (saved["optimizer"]["learning_rate"], saved["seed"]) == (r["learning_rate"], r["seed"])
    assert out["best_learning_rate"] in (1e-3, 3e-3) and set(out["median"]) == {"accuracy"}
    assert json.loads((tmp_path / "grid.json").read_text())["median"] == out["median"]
    md = (tmp_path / "grid.md").read_text()
    assert "sst2: median of 2 seeds" in md and md.count("(chosen)") == 1
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/results.json")}
    assert grid.grid(c, [1e-3, 3e-3], [0, 1], tmp_path)["median"] == out["median"]  # read back, not rerun
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/results.json")} == stamps


def write(path, task, scores, name="results.json"):
    path.mkdir(parents=True)
    record = {"task": task, "scores": scores} if name == "results.json" else {"task": task, "median": scores}
    (path / name).write_text(json.dumps(record))
    return str(path)


def test_glue_score_card_averages_each_tasks_metrics_then_the_tasks(tmp_path):
    dirs = [write(tmp_path / "mrpc", "mrpc", {"f1": 90.0, "accuracy": 86.0}),
            write(tmp_path / "cola", "cola", {"mcc": 60.0, "accuracy": 83.0}, "grid.json"),
            write(tmp_path / "mnli", "mnli", {"validation_matched_accuracy": 84.0,
                                              "validation_mismatched_accuracy": 85.0})]
    card = grid.score_card(dirs)
    lines = card.splitlines()
    assert [line.split(" | ")[0] for line in lines[2:5]] == ["| cola", "| mrpc", "| mnli"]  # the leaderboard's order
    assert "| mrpc | f1 90.0 / accuracy 86.0 | 88.0 |" in lines and "| cola | mcc 60.0 | 60.0 |" in lines
    assert "| mnli | matched_accuracy 84.0 / mismatched_accuracy 85.0 | 84.5 |" in lines
    assert lines[-1] == "| **average** | 3 of 9 tasks: not the GLUE score | **77.5** |"  # (88 + 60 + 84.5) / 3
    with pytest.raises(UserError, match="is a swag run"):
        grid.score_card([write(tmp_path / "swag", "swag", {"accuracy": 1.0})])
    with pytest.raises(UserError, match="given twice"):
        grid.score_card([dirs[0], dirs[0]])
    with pytest.raises(UserError, match="neither grid.json nor results.json"):
        grid.score_card([str(tmp_path)])


def test_cli_one_line_errors(capsys):
    assert grid.main(["grid", "--score_card", "/nonexistent"]) == 2
    assert "neither grid.json nor results.json" in capsys.readouterr().err
    assert grid.main(["grid", "--config", "configs/finetune/embedded.py", "--learning_rates", "fast"]) == 2
    assert "--learning_rates fast: give numbers" in capsys.readouterr().err
