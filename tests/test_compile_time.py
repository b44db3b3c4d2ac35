"""The compile-time benchmark measures scanned and unscanned train steps that compute the same thing."""

import json

import numpy as np
import pytest

from benchmarks import compile_time


def test_scanned_and_unscanned_steps_are_timed_and_give_the_same_losses(tmp_path):
    rows = compile_time.main(["--presets", "tiny", "--remat", "full", "--batch_size", "2", "--seq_len", "16",
                              "--predictions", "2", "--vocab_size", "128", "--step_presets", "tiny", "--steps", "2",
                              "--dropout", "0", "--out", str(tmp_path)])
    assert [(r["preset"], r["remat"], r["scan"]) for r in rows] == [("tiny", "full", False), ("tiny", "full", True)]
    unscanned, scanned = rows
    for row in rows:
        assert row["lower_s"] > 0 and row["compile_s"] > 0 and row["compile_cpu_s"] > 0 and row["temp_mib"] > 0
        assert row["step_s"] > 0 and len(row["losses"]) == 3  # one warm-up step + 2 timed
    # Scanning changes the parameters' layout, not their number: the same state goes in.
    assert scanned["argument_mib"] == unscanned["argument_mib"]
    # At initialisation the logits are near uniform: MLM loss ~ ln(vocab), NSP ~ ln 2.
    assert unscanned["losses"][0] == pytest.approx(np.log(128) + np.log(2), rel=0.05)
    # Step 0 has learning rate 0 (warmup); step 1's AdamW update moves the loss of step 2.
    assert abs(unscanned["losses"][2] - unscanned["losses"][0]) > 1e-4
    # Same weights (stacked for the scan), same batch, no dropout: the same losses, also after an update.
    np.testing.assert_allclose(scanned["losses"], unscanned["losses"], rtol=0, atol=1e-5)

    assert [json.loads(line) for line in (tmp_path / "compile_time.jsonl").read_text().splitlines()] == rows
    header, rule, *cells = (tmp_path / "compile_time.md").read_text().splitlines()
    assert header == "| " + " | ".join(compile_time.COLUMNS) + " |"
    assert [c.split(" | ")[:5] for c in cells] == [["| tiny", "2", "16", "full", "False"],
                                                  ["| tiny", "2", "16", "full", "True"]]
    assert all(c.endswith(f"| {r['losses'][0]:.6f} |") for c, r in zip(cells, rows))
