"""Import Hugging Face checkpoints as bertology run directories, and export runs as HF checkpoints.

An import writes what `bertology.pretrain --workdir` writes: `config.json` (with the `model` block
and `data.vocab`) and an orbax checkpoint at step 0 holding the parameters, so
`bertology.train.checkpoint.load_params` and everything built on it (fine-tuning, features,
export) reads it like a pretraining run. The tokenizer file is copied beside it.

Tensors are read with numpy only (safetensors; torch just for the legacy `pytorch_model.bin`), and
export writes safetensors, so neither direction needs transformers.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from bertology import models
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.interop import hf_config, names
from bertology.train.checkpoint import Checkpointer, load_params

TOKENIZER_FILES = ("vocab.txt", "spiece.model")  # what our tokenizers read: WordPiece, sentencepiece
BUFFERS = ("position_ids", "token_type_ids")  # HF buffers some checkpoints carry; not parameters
Flat = dict[tuple[str, ...], np.ndarray]


@dataclasses.dataclass
class ImportReport:
    """What an import did: tensors left at their fresh init (heads the checkpoint lacks), and
    checkpoint tensors nothing reads (e.g. a fine-tuned classifier)."""

    family: str
    vocab: pathlib.Path | None
    fresh: list[str]
    unused: list[str]


def _safetensors_numpy() -> Any:
    try:
        import safetensors.numpy
    except ImportError:
        raise UserError("reading and writing Hugging Face checkpoints needs safetensors: pip install safetensors") from None
    return safetensors.numpy


def read_tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of an HF model directory as float32 numpy, by state-dict name."""
    single, index, legacy = (directory / n for n in
                             ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    if single.exists() or index.exists():
        files = [single] if single.exists() else sorted(
            {directory / f for f in json.loads(index.read_text())["weight_map"].values()})
        load = _safetensors_numpy().load_file
        tensors = {k: v for f in files for k, v in load(str(f)).items()}
    elif legacy.exists():
        try:
            import torch
        except ImportError:
            raise UserError(f"{legacy} is a torch pickle and reading it needs torch; or convert it to safetensors") from None
        tensors = {k: v.float().numpy() for k, v in torch.load(legacy, map_location="cpu", weights_only=True).items()}
    else:
        raise UserError(f"{directory} has no model.safetensors or pytorch_model.bin; pass a Hugging Face model directory")
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path} not found; pass a Hugging Face model directory (config.json + weights)")
    return json.loads(path.read_text())


def _with_prefix(tensors: dict[str, np.ndarray], family: str) -> dict[str, np.ndarray]:
    """A bare trunk (`BertModel`, `ElectraModel`) saves names without the family prefix; add it."""
    if any(k.startswith(f"{family}.") for k in tensors):
        return tensors
    return {(f"{family}.{k}" if k.startswith(("embeddings", "encoder", "pooler")) else k): v for k, v in tensors.items()}


def _init(model: nn.Module) -> Any:
    """`() -> params` at their initialisation; `jax.eval_shape` of it gives the shapes for free."""
    batch = {k: np.zeros((1, 2), np.int32) for k in ("input_ids", "segment_ids", "masked_positions")}
    batch["input_mask"] = np.ones((1, 2), np.int32)
    return lambda: nn.meta.unbox(model.init(jax.random.key(0), batch)["params"])


def _sources(family: str, hf_dir: pathlib.Path, generator_dir: pathlib.Path | None) -> dict[str, pathlib.Path]:
    if family != "electra":
        if generator_dir is not None:
            raise UserError("--generator applies to ELECTRA only")
        return {"model": hf_dir}
    return {"discriminator": hf_dir, **({"generator": generator_dir} if generator_dir else {})}


def _fill(shapes: dict[tuple[str, ...], tuple[int, ...]], rows: list[names.Tensor],
          tensors: dict[str, dict[str, np.ndarray]], dirs: dict[str, pathlib.Path]) -> Flat:
    """Our parameters that the checkpoints hold, each checked against the shape the config builds."""
    params = {}
    for row in rows:
        state = tensors.get(row.source)
        if row.export_only or state is None:
            continue
        if row.hf not in state:
            if row.trunk:
                raise UserError(f"{dirs[row.source]} has no tensor {row.hf} (ours: {'/'.join(row.ours)}); "
                                "its weights do not fit its config.json")
            continue
        shape = shapes[row.ours]
        expected, got = names.hf_shape(row.rule, shape), state[row.hf].shape
        if got != expected:
            raise UserError(f"{dirs[row.source]}: tensor {row.hf} has shape {got} but the config builds {expected} "
                            f"(ours: {'/'.join(row.ours)} {shape})")
        params[row.ours] = names.to_ours(row.rule, state[row.hf], shape)
    return params


def _check_tied(family: str, tensors: dict[str, dict[str, np.ndarray]], dirs: dict[str, pathlib.Path]) -> None:
    """Our output layers are tied to the input tables; an untied checkpoint would change the logits."""
    for source, state in tensors.items():
        for tied, target in names.TIED[family].items():
            if tied in state and target in state and not np.array_equal(state[tied], state[target]):
                raise UserError(f"{dirs[source]}: {tied} differs from {target}; untied output layers are not supported")


def import_hf(hf_dir: str | pathlib.Path, workdir: str | pathlib.Path,
              generator_dir: str | pathlib.Path | None = None) -> ImportReport:
    """Write the HF checkpoint in `hf_dir` (ELECTRA: the discriminator, plus optionally its
    generator in `generator_dir`) as a bertology run directory `workdir`."""
    hf_dir, workdir = pathlib.Path(hf_dir), pathlib.Path(workdir)
    generator_dir = pathlib.Path(generator_dir) if generator_dir else None
    if (workdir / "checkpoints").exists():
        raise UserError(f"{workdir} already holds checkpoints; pass a new --out directory")
    generator_json = _read_json(generator_dir / "config.json") if generator_dir else None
    block = hf_config.from_hf(_read_json(hf_dir / "config.json"), str(hf_dir), generator_json)
    family = block["family"]
    dirs = _sources(family, hf_dir, generator_dir)
    tensors = {source: _with_prefix(read_tensors(d), family) for source, d in dirs.items()}
    _check_tied(family, tensors, dirs)
    if family in names.POOLERS:  # a checkpoint without a pooler imports as a model without one
        block["pooler"] = f"{family}.{names.POOLERS[family]}.weight" in tensors["model"]
    model = models.build(ml_collections.ConfigDict(block))
    rows = names.tensors(family, models.encoder_config(block), getattr(model, "generator_cfg", None))
    init = _init(model)
    shapes = {k: v.shape for k, v in flatten_dict(jax.eval_shape(init)).items()}
    params = _fill(shapes, rows, tensors, dirs)
    fresh = sorted(set(shapes) - set(params))  # heads the checkpoint lacks keep their initialisation
    if fresh:
        initial = flatten_dict(jax.jit(init)())
        params.update({k: np.asarray(initial[k]) for k in fresh})
    known = {r.hf for r in rows} | set(names.TIED[family])
    unused = sorted(f"{dirs[s]}: {k}" for s, state in tensors.items() for k in state
                    if k not in known and not k.endswith(BUFFERS))

    vocab = _write_run(workdir, block, params, dirs)
    return ImportReport(family, vocab, ["/".join(k) for k in fresh], unused)


def _write_run(workdir: pathlib.Path, block: dict[str, Any], params: Flat,
               dirs: dict[str, pathlib.Path]) -> pathlib.Path | None:
    """config.json, the step-0 checkpoint and the tokenizer file (if ours can read it); returns the latter."""
    main = next(iter(dirs.values()))
    vocab = next((workdir / n for n in TOKENIZER_FILES if (main / n).is_file()), None)
    workdir.mkdir(parents=True, exist_ok=True)
    if vocab is not None:
        shutil.copyfile(main / vocab.name, vocab)
    config = {"model": block, "data": {"vocab": str(vocab.absolute()) if vocab else None},
              "imported_from": {s: str(d.absolute()) for s, d in dirs.items()}}
    (workdir / "config.json").write_text(json.dumps(config, indent=2))
    checkpointer = Checkpointer(workdir, keep=1)
    checkpointer.save(0, {"step": np.zeros((), np.int32), "params": unflatten_dict(params)}, {})
    checkpointer.wait()
    checkpointer.close()
    return vocab


def _export_tokenizer(vocab: str | None, target: pathlib.Path) -> None:
    """Copy the run's tokenizer file under the name HF looks for; WordPiece also gets its casing."""
    if not vocab or not pathlib.Path(vocab).is_file():
        return
    path = pathlib.Path(vocab)
    if path.suffix == ".txt":
        shutil.copyfile(path, target / "vocab.txt")
        lower = load_tokenizer(path).basic.do_lower_case
        (target / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": lower}, indent=2))
    else:
        shutil.copyfile(path, target / "spiece.model")


def export_hf(workdir: str | pathlib.Path, out_dir: str | pathlib.Path, step: int | None = None) -> list[pathlib.Path]:
    """Write the run in `workdir` as HF checkpoint directories (ELECTRA: `discriminator/` and
    `generator/` under `out_dir`, else `out_dir` itself); returns them."""
    workdir, out_dir = pathlib.Path(workdir), pathlib.Path(out_dir)
    params, run_config = load_params(workdir, step)
    block = run_config["model"]
    family = block["family"]
    model = models.build(ml_collections.ConfigDict(block))
    cfg = models.encoder_config(block)
    generator_cfg = getattr(model, "generator_cfg", None)
    configs = ({"discriminator": cfg, "generator": generator_cfg} if family == "electra" else {"model": cfg})
    hf_configs = {source: hf_config.to_hf(block, c, source) for source, c in configs.items()}
    flat = flatten_dict(params)
    tensors: dict[str, dict[str, np.ndarray]] = {source: {} for source in configs}
    for row in names.tensors(family, cfg, generator_cfg):
        if row.ours not in flat:
            raise UserError(f"{workdir}: the checkpoint has no tensor {'/'.join(row.ours)}; it does not fit its config.json")
        tensors[row.source][row.hf] = names.to_hf(row.rule, np.asarray(flat[row.ours], np.float32))
    written = []
    for source, state in tensors.items():
        target = out_dir / source if len(tensors) > 1 else out_dir
        target.mkdir(parents=True, exist_ok=True)
        _safetensors_numpy().save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
        (target / "config.json").write_text(json.dumps(hf_configs[source], indent=2))
        _export_tokenizer(run_config.get("data", {}).get("vocab"), target)
        written.append(target)
    return written
