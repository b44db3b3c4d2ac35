"""Import Hugging Face checkpoints as bertology run directories, and export runs as HF checkpoints.

An import writes what `bertology.pretrain --workdir` writes: `config.json` (with the `model` block
and `data.vocab`) and an orbax checkpoint at step 0 holding the parameters, so
`bertology.train.checkpoint.load_params` and everything built on it (fine-tuning, features,
generation, export) reads it like a pretraining run. The tokenizer files are copied beside it.

Everything that differs between model types is in their records (each family's `interop.py`,
found by `interop/records.py`); this module only moves tensors and files. Tensors are read with
numpy only (safetensors; torch just for the legacy `pytorch_model.bin`), and export writes
safetensors, so neither direction needs transformers.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from bertology import models
from bertology.data.tokenizers import Tokenizer, load_tokenizer, tokenizer_files
from bertology.errors import UserError
from bertology.files import atomic_copy, atomic_file, atomic_write, new_directory
from bertology.interop import card, hf_config, names, records
from bertology.train.checkpoint import Checkpointer, load_run, read_json

# HF buffers some checkpoints carry (GPT-2's causal masks among them); not parameters
BUFFERS = ("position_ids", "token_type_ids", ".attn.bias", ".attn.masked_bias")
# The tokenizer files ours reads, in the order an import looks for them. vocab.json + merges.txt
# are a byte-level BPE only under these HF classes (OpenAI GPT's BPE uses the same file names).
WORDPIECE, SENTENCEPIECE, BYTE_BPE = ("vocab.txt",), ("spiece.model",), ("vocab.json", "merges.txt")
BYTE_LEVEL_CLASSES = ("GPT2Tokenizer", "GPT2TokenizerFast", "RobertaTokenizer", "RobertaTokenizerFast",
                      "BartTokenizer", "BartTokenizerFast")
Flat = dict[tuple[str, ...], np.ndarray]


@dataclasses.dataclass
class ImportReport:
    """What an import did: tensors left at their fresh init (heads the checkpoint lacks), and
    checkpoint tensors nothing reads (e.g. a fine-tuned classifier)."""

    family: str
    model_type: str
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


HF_DIR = "pass a Hugging Face model directory (config.json + weights), or restore the file from the model's release"


def _with_prefix(tensors: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """A bare trunk (`BertModel`, `GPT2Model`) saves its names without the trunk's prefix; add it
    (T5 has none: its bare model and its LM model name the trunk alike)."""
    if not prefix or any(k.startswith(f"{prefix}.") for k in tensors):
        return tensors
    return {f"{prefix}.{k}": v for k, v in tensors.items()}


def _boxed_init(model: nn.Module) -> Any:
    """`() -> params` at their initialisation, each with its logical axis names (`nn.Partitioned`)."""
    batch = {k: np.zeros((1, 2), np.int32) for k in ("input_ids", "segment_ids", "masked_positions",
                                                      "decoder_input_ids")}
    batch["input_mask"] = batch["decoder_input_mask"] = np.ones((1, 2), np.int32)
    return lambda: model.init(jax.random.key(0), batch)["params"]


def _init(model: nn.Module) -> Any:
    """`() -> params` at their initialisation; `jax.eval_shape` of it gives the shapes for free."""
    boxed = _boxed_init(model)
    return lambda: nn.meta.unbox(boxed())


def param_shapes(model: nn.Module) -> dict[tuple[str, ...], tuple[int, ...]]:
    """The flattened parameter paths and shapes `model` builds (nothing is computed)."""
    return {k: v.shape for k, v in flatten_dict(jax.eval_shape(_init(model))).items()}


def vocab_axes(model: nn.Module) -> dict[tuple[str, ...], int]:
    """Each flattened parameter path with a `vocab` axis (the token table, output biases, an
    untied output layer), and that axis: what `model.vocab_multiple` pads and HF never holds."""
    boxed = jax.eval_shape(_boxed_init(model))
    return {k: v.names.index("vocab") for k, v in flatten_dict(boxed).items()
            if isinstance(v, nn.Partitioned) and "vocab" in v.names}


def _vocab_shapes(shapes: dict[tuple[str, ...], tuple[int, ...]], axes: dict[tuple[str, ...], int],
                  size: int) -> dict[tuple[str, ...], tuple[int, ...]]:
    """`shapes` with each `vocab` axis at `size` entries: the shapes HF holds."""
    return {k: tuple(size if i == axes.get(k) else d for i, d in enumerate(shape)) for k, shape in shapes.items()}


def _to_vocab(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """`x` with its `vocab` axis cut to `size` entries (export) or padded with zero rows to them
    (import): the padded ids' rows are never read (`TransformerConfig.real_logits`)."""
    if x.shape[axis] >= size:
        return x[(slice(None),) * (axis % x.ndim) + (slice(0, size),)]
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths)


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
        expected, got = row.hf_shape(shape), state[row.hf].shape
        if got != expected:
            raise UserError(f"{dirs[row.source]}: tensor {row.hf} has shape {got} but the config builds {expected} "
                            f"(ours: {'/'.join(row.ours)} {shape})")
        params[row.ours] = row.to_ours(state[row.hf], shape)
    return params


def _check_tied(record: records.HFModel, tensors: dict[str, dict[str, np.ndarray]],
                dirs: dict[str, pathlib.Path]) -> None:
    """Our output layers are tied to the input tables; an untied checkpoint would change the logits."""
    for source, state in tensors.items():
        for tied, target in record.tied.items():
            if tied in state and target in state and not np.array_equal(state[tied], state[target]):
                raise UserError(f"{dirs[source]}: {tied} differs from {target}; untied output layers are not supported")


def import_hf(hf_dir: str | pathlib.Path, workdir: str | pathlib.Path,
              generator_dir: str | pathlib.Path | None = None, vocab_multiple: int = 1) -> ImportReport:
    """Write the HF checkpoint in `hf_dir` (ELECTRA: the discriminator, plus optionally its
    generator in `generator_dir`) as a bertology run directory `workdir`. `vocab_multiple` > 1
    pads the token table and every [vocab] tensor with zero rows (`model.vocab_multiple`)."""
    hf_dir, workdir = pathlib.Path(hf_dir), pathlib.Path(workdir)
    _check_new_run(workdir)
    main_json = read_json(hf_dir / "config.json", HF_DIR)
    record = records.by_type(main_json.get("model_type"), str(hf_dir / "config.json"))
    extra = {"generator": generator_dir} if generator_dir else {}
    for source in extra:
        if source not in record.sources[1:]:
            raise UserError(f"--{source} applies to {', '.join(records.with_extra_source(source))} only, "
                            f"not {record.model_type}")
    dirs = {record.sources[0]: hf_dir, **{s: pathlib.Path(d) for s, d in extra.items()}}
    configs = {source: main_json if source == record.sources[0] else read_json(d / "config.json", HF_DIR)
               for source, d in dirs.items()}
    block = hf_config.from_hf(record, configs, {s: str(d) for s, d in dirs.items()})
    tensors = {source: _with_prefix(read_tensors(d), record.prefix) for source, d in dirs.items()}
    _check_tied(record, tensors, dirs)
    for state in tensors.values():
        state.update({k: state[t] for k, t in record.tied_if_absent.items() if k not in state and t in state})
    if record.pooler:  # a checkpoint without a pooler imports as a model without one
        block["pooler"] = record.pooler in tensors[record.sources[0]]
    if vocab_multiple != 1:
        block["vocab_multiple"] = vocab_multiple
    model = models.build(ml_collections.ConfigDict(block))
    shapes, axes = param_shapes(model), vocab_axes(model)
    rows = names.tensors(record.layout, shapes)
    params = _fill(_vocab_shapes(shapes, axes, block["vocab_size"]), rows, tensors, dirs)
    params = {k: _to_vocab(v, axes[k], shapes[k][axes[k]]) if k in axes else v for k, v in params.items()}
    fresh = sorted(set(shapes) - set(params))  # heads the checkpoint lacks keep their initialisation
    if fresh:
        initial = flatten_dict(jax.jit(_init(model))())
        params.update({k: np.asarray(initial[k]) for k in fresh})
    known = {r.hf for r in rows} | set(record.tied) | set(record.tied_if_absent) | set(record.copies)
    unused = sorted(f"{dirs[s]}: {k}" for s, state in tensors.items() for k in state
                    if k not in known and not k.endswith(BUFFERS))
    files = _tokenizer_files(hf_dir, record)
    vocab = write_run(workdir, block, unflatten_dict(params), files, {s: str(d.absolute()) for s, d in dirs.items()})
    return ImportReport(record.family, record.model_type, vocab, ["/".join(k) for k in fresh], unused)


def _tokenizer_files(directory: pathlib.Path, record: records.HFModel) -> list[pathlib.Path]:
    """The tokenizer files in an HF directory that ours reads with the ids HF gives; [] if none."""
    config = directory / "tokenizer_config.json"
    hf_class = (json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None) or record.tokenizer
    for kind in (WORDPIECE, SENTENCEPIECE, BYTE_BPE):
        files = [directory / name for name in kind]
        if all(f.is_file() for f in files) and (kind != BYTE_BPE or hf_class in BYTE_LEVEL_CLASSES):
            return files
    return []


def _check_new_run(workdir: pathlib.Path) -> None:
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise UserError(f"{workdir} already exists and is not empty; pass a new directory")


def write_run(workdir: str | pathlib.Path, block: dict[str, Any], params: dict, vocab_files: Sequence[pathlib.Path] = (),
              imported_from: dict[str, str] | None = None, task: str | None = None) -> pathlib.Path | None:
    """A run directory as pretraining writes it: config.json (`model` block, `data.vocab`; with
    `task`, the fine-tuning task whose `head` `params` hold, so a fine-tuning run of that task
    starts from it), a step-0 checkpoint of `params`, and copies of the tokenizer's `vocab_files`
    (vocab first); returns the copy that `data.vocab` names (None without a tokenizer). The directory is built
    under a temporary name and renamed into place, so a killed import leaves no half-run that the
    next import would refuse or a fine-tuning would read."""
    workdir = pathlib.Path(workdir)
    _check_new_run(workdir)
    vocab = workdir / vocab_files[0].name if vocab_files else None
    config = {"model": block, "data": {"vocab": str(vocab.absolute()) if vocab else None}}
    if imported_from:
        config["imported_from"] = imported_from
    if task:
        config["task"] = task
    with new_directory(workdir) as tmp:
        for f in vocab_files:
            shutil.copyfile(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        checkpointer = Checkpointer(tmp, keep=1)
        checkpointer.save(0, {"step": np.zeros((), np.int32), "params": params}, {})
        checkpointer.wait()
        checkpointer.close()
    return vocab


def run_tokenizer_files(vocab: str | None) -> list[pathlib.Path]:
    """The files of a run's tokenizer (its `data.vocab`), vocab first, for `write_run` of a run made
    from it; none when the run has no tokenizer or its files are gone."""
    return tokenizer_files(vocab) if vocab and pathlib.Path(vocab).exists() else []


def _run_tokenizer(vocab: str | None) -> tuple[list[pathlib.Path], Tokenizer | None]:
    """The run's tokenizer files and the tokenizer (none when the run has none or they are gone)."""
    files = run_tokenizer_files(vocab)
    return files, load_tokenizer(vocab) if files else None


def _export_tokenizer(files: list[pathlib.Path], tokenizer: Tokenizer, target: pathlib.Path) -> None:
    """Copy the tokenizer files under the names HF looks for, with a tokenizer_config.json naming
    the HF class that gives our ids (WordPiece with its casing; a byte-level BPE as GPT-2's or
    RoBERTa's, whatever the model type)."""
    kind = files[0].suffix
    if kind == ".model":
        atomic_copy(files[0], target / SENTENCEPIECE[0])
        return
    if kind == ".txt":
        atomic_copy(files[0], target / WORDPIECE[0])
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.basic.do_lower_case}
    else:
        for f, name in zip(files, BYTE_BPE):
            atomic_copy(f, target / name)
        config = dict(tokenizer.hf_config)
    atomic_write(target / "tokenizer_config.json", json.dumps(config, indent=2))


def export_hf(workdir: str | pathlib.Path, out_dir: str | pathlib.Path, step: int | None = None) -> list[pathlib.Path]:
    """Write the run in `workdir` as HF checkpoint directories (ELECTRA: `discriminator/` and
    `generator/` under `out_dir`, else `out_dir` itself), each with the run's tokenizer files, a
    model card and, for a model that generates, a generation_config.json; returns them."""
    workdir, out_dir = pathlib.Path(workdir), pathlib.Path(out_dir)
    params, run_config, exported = load_run(workdir, step)
    block = run_config["model"]
    record = records.for_run(block)
    files, tokenizer = _run_tokenizer(run_config.get("data", {}).get("vocab"))
    hf_configs = {source: hf_config.to_hf(record, block, source, cfg, tokenizer)
                  for source, cfg in record.configs(block).items()}
    model = models.build(ml_collections.ConfigDict(block))
    shapes, axes = param_shapes(model), vocab_axes(model)
    rows = names.tensors(record.layout, shapes)
    missing = sorted(set(shapes) - {r.ours for r in rows})
    if missing:
        raise UserError(f"{record.model_type} has no tensor for our {'/'.join(missing[0])}; this model cannot be "
                        "exported without dropping it")
    # the padded rows go; a tensor of another shape than the config builds is left for export_state to refuse
    flat = {k: _to_vocab(np.asarray(v), axes[k], block["vocab_size"]) if k in axes and v.shape == shapes[k] else v
            for k, v in flatten_dict(params).items()}
    state = names.export_state(rows, flat, _vocab_shapes(shapes, axes, block["vocab_size"]), str(workdir))
    for tensors in state.values():
        tensors.update({k: tensors[v].copy() for k, v in record.copies.items() if v in tensors})
    written = []
    for source in record.sources:
        target = out_dir / source if len(record.sources) > 1 else out_dir
        # HF's loaders start from config.json: it goes first and comes back last, so a directory
        # being rewritten (or left by a killed export) is no checkpoint, never new weights under an
        # old config. A previous export's files that this one does not write go too.
        for name in ("config.json", "model.safetensors", "tokenizer_config.json", *WORDPIECE, *SENTENCEPIECE, *BYTE_BPE,
                     "README.md", "generation_config.json"):
            (target / name).unlink(missing_ok=True)
        with atomic_file(target / "model.safetensors") as tmp:
            _safetensors_numpy().save_file(state[source], str(tmp), metadata={"format": "pt"})
        if tokenizer is not None:
            _export_tokenizer(files, tokenizer, target)
        atomic_write(target / "README.md", card.model_card(workdir, run_config, exported, record.model_type,
                                                            record.architectures[source]))
        if record.generates:
            atomic_write(target / "generation_config.json", json.dumps(card.generation_config(hf_configs[source]), indent=2))
        atomic_write(target / "config.json", json.dumps(hf_configs[source], indent=2))
        written.append(target)
    return written
