"""Experiment trackers (bertology.train.trackers): a tiny run logs to W&B offline and to trackio,
each receives metrics.jsonl's rows and the resolved config, and a resumed run continues the same
tracker runs. The runs go through the command line in subprocesses: trackio fixes its directory
(TRACKIO_DIR) when it is imported, so each run needs a fresh interpreter anyway."""

import json
import os
import struct
import subprocess
import sys

import pytest

from helpers import REPO

pytest.importorskip("wandb")
pytest.importorskip("trackio")

RUN = ["--config=configs/bert.py:tiny", "--config.batch_size=8", "--config.data.max_seq_length=32",
       "--config.data.max_predictions_per_seq=5", "--config.log_every=1", "--config.eval_every=2",
       "--config.logging.wandb.project=bertology-test", "--config.logging.wandb.mode=offline",
       "--config.logging.trackio.project=bertology-test"]


def pretrain(workdir, env, *args):
    r = subprocess.run([sys.executable, "-m", "bertology", "pretrain", f"--workdir={workdir}", *RUN, *args],
                       capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]


def wandb_records(path):
    """The protobuf records of a W&B run file (run-ID.wandb): a 7-byte header (":W&B", magic 0xBEE1,
    version 0), then LevelDB-log records in 32 KiB blocks: CRC (4 bytes), length (2), type (1:
    whole, 2/3/4: first/middle/last piece of a record split across blocks), data."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), "not a W&B run file"
    block, pos, pieces = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        if kind == 0 and length == 0:  # zero padding at the end
            break
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            yield record
            pieces = b""


def wandb_rows(run_dir):
    """{step: row} of the history a W&B offline run directory holds, its config, and its run id."""
    (file,) = [f for f in os.listdir(run_dir) if f.endswith(".wandb")]
    rows, config, run_id = {}, {}, None
    for record in wandb_records(os.path.join(run_dir, file)):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {key: json.loads(item.value_json) for item in record.history.item
                   if not (key := item.key or ".".join(item.nested_key)).startswith("_")}  # _step, _runtime: W&B's own
            rows.setdefault(int(row.pop("step")), {}).update(row)
        elif kind in ("config", "run"):  # the run record carries the config wandb.init was given
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in updates})
            run_id = record.run.run_id if kind == "run" else run_id
    return rows, config, run_id


def trackio_run(env, project, name):
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps([S.get_runs(sys.argv[1]), S.get_logs(sys.argv[1], sys.argv[2]), "
            "S.get_run_config(sys.argv[1], sys.argv[2])], default=str))")
    r = subprocess.run([sys.executable, "-c", code, project, name], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def jsonl_rows(workdir):
    rows = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        row.pop("time")
        rows.setdefault(row.pop("step"), {}).update(row)
    return rows


@pytest.mark.slow
def test_a_run_logs_to_wandb_offline_and_trackio_and_its_resume_continues_the_same_runs(tmp_path):
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "WANDB_SILENT": "true",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    workdir = tmp_path / "run"
    pretrain(workdir, env, "--config.total_steps=2")
    ids = json.loads((workdir / "trackers.json").read_text())
    pretrain(workdir, env, "--config.total_steps=3", "--config.allow_config_change=total_steps")
    assert json.loads((workdir / "trackers.json").read_text()) == ids, "a resume must reopen the same tracker runs"
    expected = jsonl_rows(workdir)
    assert sorted(expected) == [1, 2, 3] and "eval_loss" in expected[2]

    # W&B: one offline directory per start, both under the recorded id; together they hold every row
    starts = sorted(d for d in os.listdir(workdir / "wandb") if d.startswith("offline-run-"))
    assert len(starts) == 2 and all(d.endswith("-" + ids["wandb"]) for d in starts), starts
    logged, configs = {}, []
    for d in starts:
        rows, config, run_id = wandb_rows(workdir / "wandb" / d)
        assert run_id == ids["wandb"]
        logged.update(rows)
        configs.append(config)
    assert logged == expected, "W&B must receive metrics.jsonl's rows"
    saved = json.loads((workdir / "config.json").read_text())
    assert configs[0]["model"] == saved["model"] and configs[1]["total_steps"] == 3

    # trackio: one run, by the recorded name, holding every row and the config
    runs, logs, config = trackio_run(env, "bertology-test", ids["trackio"])
    assert runs == [ids["trackio"]], "the resume must continue the trackio run, not start a second"
    got = {}
    for entry in logs:
        entry.pop("timestamp")
        got.setdefault(entry.pop("step"), {}).update(entry)
    assert got == expected, "trackio must receive metrics.jsonl's rows"
    assert config["model"] == saved["model"]


def test_a_tracker_that_is_not_installed_is_a_one_line_error(tmp_path, monkeypatch):
    from etils import epath

    from bertology.errors import UserError
    from bertology.train import trackers
    from helpers import tiny_config

    monkeypatch.setitem(sys.modules, "trackio", None)  # import trackio now raises ImportError
    config = tiny_config(**{"logging.trackio.project": "p"})
    with pytest.raises(UserError, match=r'trackio is not installed; pip install "bertology\[trackio\]"'):
        trackers.open_trackers(config, epath.Path(tmp_path))
    assert not (tmp_path / "trackers.json").exists(), "nothing is recorded for a tracker that never opened"
    assert trackers.open_trackers(tiny_config(), epath.Path(tmp_path)) == [], "no project named: no tracker"


def test_an_unknown_wandb_mode_is_refused_before_the_run_starts():
    from bertology import validation
    from bertology.errors import UserError
    from helpers import tiny_config

    with pytest.raises(UserError, match=r"logging.wandb.mode='disabled' is not one of 'online', 'offline'"):
        validation.check(tiny_config(**{"logging.wandb.mode": "disabled"}))
