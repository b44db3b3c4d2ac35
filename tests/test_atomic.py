"""Every artefact a command writes survives kill -9 at any moment: what it leaves is the previous
complete artefact, the new one, or a state the artefact's readers refuse ("none"), never a partial
artefact a later run would trust; and the same command run again over what the kill left writes
the whole new artefact.

The kills are simulated exactly and exhaustively, in-process: every call that creates, truncates,
renames or removes a path under the watched directory records the directory just before and just
after it. That is what kill -9 at that instant leaves on disk (the bytes a killed process wrote
stay in the page cache; Python buffers it never flushed were never on disk). The writers: HF
export (`convert --to hf`, ELECTRA's two directories), a run directory written by `convert --from
hf` or `longify`, `bertology.features`' .npz, a sweep's table and plot, and ELMo's hdf5 export.
"""

import builtins
import io
import json
import os
import pathlib
import re
import shutil
import threading

import helpers
import jax
import numpy as np
import pytest
from flax.traverse_util import unflatten_dict

from bertology import models
from bertology.errors import UserError
from bertology.interop.hf import export_hf, param_shapes, write_run
from bertology.train.checkpoint import load_params

NONE = "none"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def snapshot(root: pathlib.Path) -> dict[str, bytes]:
    """Every file under `root` (relative path → bytes), as a reader would find it now."""
    out = {}
    for p in sorted(root.rglob("*")):
        try:
            if p.is_file():
                out[str(p.relative_to(root))] = p.read_bytes()
        except FileNotFoundError:  # removed by a background writer while we looked
            pass
    return out


class Kills:
    """Patches the calls that change a directory's entries to record `root` before and after each."""

    def __init__(self, root: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
        self.root, self.states, self.lock = root.resolve(), [], threading.RLock()
        self.busy = False
        for module, name in [(os, "replace"), (os, "rename"), (os, "unlink"), (os, "remove"), (os, "rmdir"),
                             (os, "mkdir"), (shutil, "rmtree")]:
            monkeypatch.setattr(module, name, self.wrap(getattr(module, name), lambda *a, **k: True))
        monkeypatch.setattr(os, "open", self.wrap(os.open, lambda path, flags, *a, **k: bool(flags & WRITE_FLAGS)))
        writes = lambda file, mode="r", *a, **k: any(c in mode for c in "wax+")  # noqa: E731
        monkeypatch.setattr(builtins, "open", self.wrap(builtins.open, writes))
        monkeypatch.setattr(io, "open", self.wrap(io.open, writes))

    def watched(self, args: tuple, kwargs: dict) -> bool:
        if kwargs.get("dir_fd") is not None:  # rmtree's relative names: cannot tell, so record
            return True
        paths = [a for a in args[:2] if isinstance(a, (str, os.PathLike))]
        return any(pathlib.Path(a).resolve().is_relative_to(self.root) for a in paths)

    def wrap(self, call, changes):
        def recorded(*args, **kwargs):
            with self.lock:
                record = not self.busy and changes(*args, **kwargs) and self.watched(args, kwargs)
                if record:
                    self.record()
            result = call(*args, **kwargs)
            if record:
                with self.lock:
                    self.record()
            return result
        return recorded

    def record(self) -> None:
        self.busy = True
        try:
            self.states.append(snapshot(self.root))
        finally:
            self.busy = False


def restore(state: dict[str, bytes], root: pathlib.Path) -> None:
    for name, data in state.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def check_every_kill(tmp_path, monkeypatch, write, view, old=None) -> None:
    """Run `write(root)` under Kills. `view(state)` maps each artefact the writer makes to what a
    reader gets from it (NONE where the reader refuses); at every recorded state, each artefact
    must be NONE, what it was before, or what it is at the end, and the end must differ from the
    start. Then `write` again over the state just before the last change (the one with the most
    leftovers) must reach the same end."""
    root = tmp_path / "watched"
    root.mkdir()
    if old is not None:
        old(root)
    before = view(snapshot(root))
    kills = Kills(root, monkeypatch)
    write(root)
    monkeypatch.undo()
    final = view(snapshot(root))
    assert all(final[k] not in (NONE, before[k]) for k in final)
    views = [view(s) for s in kills.states]
    assert len(views) > 2
    for i, v in enumerate(views):
        for k in final:
            assert v[k] in (NONE, before[k], final[k]), (
                f"a kill at change {i} of {len(views)} leaves {k} partial: {sorted(kills.states[i])}")
    last = max(i for i, v in enumerate(views) if v != final)
    again = tmp_path / "again"
    again.mkdir()
    restore(kills.states[last], again)
    write(again)
    assert view(snapshot(again)) == final


def visible(state: dict[str, bytes], under: str = "") -> dict[str, bytes]:
    """The files of `state` under `under` without the hidden temporaries of a write in progress."""
    prefix = under + "/" if under else ""
    return {k[len(prefix):]: v for k, v in state.items()
            if k.startswith(prefix) and not any(part.startswith(".") for part in k.split("/"))}


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "the", "of"]


def _random_run(directory: pathlib.Path, family: str, seed: int, vocab: pathlib.Path, **model) -> dict:
    """A run directory of `family`'s tiny preset with random weights and the WordPiece `vocab`."""
    c = helpers.config(family, "tiny")
    c.model.update(vocab_size=len(VOCAB), max_position_embeddings=16, **model)
    block = c.model.to_dict()
    rng = np.random.default_rng(seed)
    shapes = param_shapes(models.build(c.model))
    params = unflatten_dict({k: rng.normal(0, 0.1, s).astype(np.float32) for k, s in shapes.items()})
    write_run(directory, block, params, [vocab])
    return params


@pytest.fixture
def vocab(tmp_path) -> pathlib.Path:
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in VOCAB))
    return path


def test_hf_export_over_a_previous_export(tmp_path, monkeypatch, vocab):
    """ELECTRA writes discriminator/ and generator/; HF reads each from its config.json."""
    _random_run(tmp_path / "old_run", "electra", 0, vocab)
    _random_run(tmp_path / "new_run", "electra", 1, vocab)

    def view(state):
        out = {}
        for source in ("discriminator", "generator"):
            files = visible(state, f"hf/{source}")
            out[source] = tuple(sorted(files.items())) if "config.json" in files else NONE
        return out

    check_every_kill(tmp_path, monkeypatch, lambda root: export_hf(tmp_path / "new_run", root / "hf"), view,
                     old=lambda root: export_hf(tmp_path / "old_run", root / "hf"))


def test_run_directory_of_an_import(tmp_path, monkeypatch, vocab):
    """`convert --from hf` and `longify` write a run directory (config.json, the step-0 checkpoint,
    the tokenizer); a half-written one would be refused by the next import ("not empty")."""
    params = {}

    def write(root):
        params.update(_random_run(root / "run", "bert", 0, vocab))

    def view(state):
        files = visible(state, "run")
        names = sorted({re.sub(r"/d/[0-9a-f]+$", "/d/*", name) for name in files})  # orbax's data files: random names
        if not files:
            return {"run": NONE}
        return {"run": (tuple(names), json.loads(files["config.json"])["model"] if "config.json" in files else None)}

    check_every_kill(tmp_path, monkeypatch, write, view)
    loaded, _ = load_params(tmp_path / "watched" / "run")
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    with pytest.raises(UserError, match="already exists and is not empty; pass a new directory"):
        write(tmp_path / "watched")


def test_features_npz_over_a_previous_one(tmp_path, monkeypatch, vocab):
    from bertology import features

    _random_run(tmp_path / "run", "bert", 0, vocab, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    (tmp_path / "input.txt").write_text("the a b\nof c\n")

    def extract(root):
        features.main(["features", "--checkpoint", str(tmp_path / "run"), "--input", str(tmp_path / "input.txt"),
                       "--out", str(root / "features.npz"), "--max_seq_length", "8"])

    check_every_kill(tmp_path, monkeypatch, extract, lambda s: {"npz": s.get("features.npz", NONE)},
                     old=lambda root: np.savez(root / "features.npz", sentence=np.zeros((1, 16))))
    with np.load(tmp_path / "watched" / "features.npz") as f:
        assert f["sentence"].shape == (2, 16)


def test_sweep_table_and_plot_over_previous_ones(tmp_path, monkeypatch):
    from bertology.sweep import write_report

    def report(score):
        rows = [{"variant": "scratch", "budget": 0.0, "steps": 0, "init_steps": 0, "flops": 0.0, "accuracy": 50.0},
                *({"variant": "mlm", "budget": b, "steps": 10 * b, "init_steps": 0, "flops": 1e12 * b,
                   "accuracy": score + b} for b in (1, 2))]
        return lambda root: write_report(rows, ["classification"], "bert", root)

    check_every_kill(tmp_path, monkeypatch, report(70.0),
                     lambda s: {name: s.get(name, NONE) for name in ("table.md", "score_vs_flops.png")},
                     old=report(60.0))


def test_elmo_hdf5_over_a_previous_export(tmp_path, monkeypatch):
    """bilm-tf's reader needs options.json and weights.hdf5 together."""
    from bertology.families.elmo import hdf5
    from bertology.families.elmo import model as elmo

    cfg = elmo.ElmoConfig(vocab_size=37, filters=((1, 4), (2, 6)), n_highway=1, projection_dim=8, lstm_dim=12,
                          max_characters_per_token=10)
    batch = {"char_ids": np.ones((1, 3, 10), np.int32), "packing_ids": np.ones((1, 3), np.int32)}
    shapes = jax.eval_shape(lambda: elmo.trunk(elmo.Model(cfg).init(jax.random.key(0), batch)["params"]))

    def export(seed):
        rng = np.random.default_rng(seed)
        params = jax.tree.map(lambda s: rng.normal(0, 0.1, s.shape).astype(np.float32), shapes)
        return lambda root: hdf5.write(root / "elmo", cfg, params)

    def view(state):
        files = visible(state, "elmo")
        return {"elmo": (files["options.json"], files["weights.hdf5"]) if "options.json" in files else NONE}

    check_every_kill(tmp_path, monkeypatch, export(1), view, old=export(0))
