"""ELMo weights in the reference's files: `options.json` + `weights.hdf5` (allenai/bilm-tf).

bilm-tf's `dump_weights` writes every trainable variable but the softmax, renamed from TF's
scopes: `char_embed` (261 rows: char ids 1-261, id 0 being "no word"), `CNN/W_cnn_i`
[1, width, dim, filters] and `CNN/b_cnn_i`, `CNN_high_i/{W_carry,b_carry,W_transform,b_transform}`,
`CNN_proj/{W_proj,b_proj}` (only when the filters' total differs from the projection), and per
direction d (0 forward, 1 backward) and layer k
`RNN_d/RNN/MultiRNNCell/Cellk/LSTMCell/{W_0,B,W_P_0}` (kernel [in + proj, 4·cells] with TF's
i, j, f, o gate order, bias, projection [cells, proj]). Our parameter trees hold the same arrays
(`model.py`), so conversion is a table of names and one reshape; files released by AllenNLP
load with `read`, and `write` produces files the reference's loader reads.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from bertology.errors import UserError
from bertology.families.elmo.model import ElmoConfig
from bertology.files import atomic_file, atomic_write

LSTM_CELL = "RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell/{name}"
LSTM_NAMES = {"kernel": "W_0", "bias": "B", "projection": "W_P_0"}


def options(cfg: ElmoConfig) -> dict:
    """The reference's options.json for `cfg` (the blocks its inference code reads)."""
    return {
        "lstm": {"use_skip_connections": cfg.use_skip_connections, "projection_dim": cfg.projection_dim,
                 "cell_clip": cfg.cell_clip, "proj_clip": cfg.proj_clip, "dim": cfg.lstm_dim, "n_layers": cfg.n_layers},
        "char_cnn": {"activation": cfg.activation, "filters": [list(f) for f in cfg.filters], "n_highway": cfg.n_highway,
                     "embedding": {"dim": cfg.char_embedding_dim}, "n_characters": cfg.n_characters,
                     "max_characters_per_token": cfg.max_characters_per_token},
        "dropout": cfg.dropout_rate,
    }


def config_from_options(opts: dict, vocab_size: int) -> ElmoConfig:
    """ElmoConfig from an options.json; `vocab_size` sizes the softmax (not in the weights file)."""
    try:
        lstm, cnn = opts["lstm"], opts["char_cnn"]
        return ElmoConfig(
            vocab_size=vocab_size, filters=tuple((int(w), int(n)) for w, n in cnn["filters"]),
            char_embedding_dim=cnn["embedding"]["dim"], n_characters=cnn["n_characters"],
            max_characters_per_token=cnn["max_characters_per_token"], activation=cnn["activation"],
            n_highway=cnn["n_highway"], projection_dim=lstm["projection_dim"], lstm_dim=lstm["dim"],
            n_layers=lstm["n_layers"], cell_clip=lstm.get("cell_clip") or 0.0, proj_clip=lstm.get("proj_clip") or 0.0,
            use_skip_connections=lstm.get("use_skip_connections", False), dropout_rate=opts.get("dropout", 0.0))
    except KeyError as e:
        raise UserError(f"options.json lacks {e.args[0]!r}; pass the options.json released with the weights") from None


def names(cfg: ElmoConfig) -> dict[tuple[str, str], tuple[str, tuple[int, ...] | None]]:
    """(our module, our param) -> (the file's dataset name, the file's shape if it reshapes)."""
    table: dict[tuple[str, str], tuple[str, tuple[int, ...] | None]] = {("char_cnn", "char_embed"): ("char_embed", None)}
    for i, (width, num) in enumerate(cfg.filters):
        table["char_cnn", f"W_cnn_{i}"] = (f"CNN/W_cnn_{i}", (1, width, cfg.char_embedding_dim, num))
        table["char_cnn", f"b_cnn_{i}"] = (f"CNN/b_cnn_{i}", None)
    for i in range(cfg.n_highway):
        for name in ("W_carry", "b_carry", "W_transform", "b_transform"):
            table["char_cnn", f"{name}_{i}"] = (f"CNN_high_{i}/{name}", None)
    if cfg.use_projection:
        table["char_cnn", "W_proj"] = ("CNN_proj/W_proj", None)
        table["char_cnn", "b_proj"] = ("CNN_proj/b_proj", None)
    for d, direction in enumerate(("forward", "backward")):
        for k in range(cfg.n_layers):
            for ours, theirs in LSTM_NAMES.items():
                table[direction, f"layer_{k}_{ours}"] = (LSTM_CELL.format(d=d, k=k, name=theirs), None)
    return table


def write(directory: str | os.PathLike, cfg: ElmoConfig, params: dict) -> pathlib.Path:
    """Write `options.json` and `weights.hdf5` (float32, the softmax left out as bilm-tf does)."""
    import h5py

    directory = pathlib.Path(directory)
    # `read` needs both files: options.json goes first and comes back last, so a directory being
    # rewritten (or left by a killed writer) is refused, never new weights read with old options
    (directory / "options.json").unlink(missing_ok=True)
    with atomic_file(directory / "weights.hdf5") as tmp, h5py.File(tmp, "w") as f:
        for (module, param), (name, shape) in names(cfg).items():
            value = np.asarray(params[module][param], np.float32)
            f.create_dataset(name, data=value if shape is None else value.reshape(shape))
    atomic_write(directory / "options.json", json.dumps(options(cfg), indent=2))
    return directory


def read(directory: str | os.PathLike, vocab_size: int) -> tuple[ElmoConfig, dict]:
    """(config, params without the softmax) from a directory with options.json and weights.hdf5."""
    import h5py

    directory = pathlib.Path(directory)
    for file in ("options.json", "weights.hdf5"):
        if not (directory / file).is_file():
            raise UserError(f"{directory / file} not found; pass the directory holding ELMo's options.json and weights.hdf5")
    cfg = config_from_options(json.loads((directory / "options.json").read_text()), vocab_size)
    params: dict[str, dict[str, np.ndarray]] = {"char_cnn": {}, "forward": {}, "backward": {}}
    with h5py.File(directory / "weights.hdf5", "r") as f:
        for (module, param), (name, shape) in names(cfg).items():
            if name not in f:
                raise UserError(f"{directory / 'weights.hdf5'} has no dataset {name}; its options.json does not match it")
            value = f[name][...]
            params[module][param] = value.reshape(value.shape[1:]) if shape is not None else value
    return cfg, params
