"""Train-step speed on the accelerator at hand: ours against Hugging Face PyTorch, taking turns.

    python -m benchmarks.accelerator [--cases bert128,bert512,bert512_xla,gpt2,t5,t5_cudnn] [--steps 10]
                                     [--vocab_multiple 128] [--profile] [--hlo DIR]
                                     [--variant NAME:OPTION=VALUE,...] [--variant_cases bert512]
                                     [--out runs/benchmarks]
    python -m benchmarks.accelerator --smoke      # tiny shapes, float32, CPU: seconds (CI runs it)

The cases are BERT-base (MLM + NSP) at 32×128 and 32×512, GPT-2 124M at 16×1024 and T5-base at
32×512→128, bf16 compute over float32 weights, each with `model.attention_backend=auto` (the
fastest kernel for its mask on this platform: cuDNN on NVIDIA GPUs, splash on TPU) and BERT 32×512
also with `xla`, to show what the kernel buys. The fused kernels take no attention dropout, so
the BERT and GPT cases run their recipe with attention dropout 0 (MosaicBERT's; hidden dropout
stays 0.1); T5, whose bucket bias keeps `auto` on xla, keeps its own, and `t5_cudnn` runs it with
attention dropout 0 on cuDNN, which adds the bias and returns its gradient. The reference runs the
same config. Each case's step and the reference's
(`benchmarks.reference_torch`: transformers with SDPA attention, bf16 autocast, the same AdamW
step and clipping) take turns of `--chunk` steps, so a clock or load change hits both alike;
within a turn the host queues each step while the device runs the last, as in training (the
`step_ms_waiting` column waits for every step: what that queueing hides).

Printed and written (`--out/accelerator.md`, one JSON line per case in `accelerator.jsonl`):
tokens/s (T5: source tokens), MFU = tokens/s × our counted training FLOPs per token (the README's
counter, `models.flops_per_token`) / the chip's dense bf16 peak (`PEAK`, or --peak_flops), the
ratio to PyTorch, the setup time (trace, probe and compile) apart from the step time, peak device
memory (ours: XLA's plan for the step, arguments + temporaries; theirs: PyTorch's allocator
peak), and the versions. Compiles go through JAX's persistent cache (--cache_dir), so a second
run on the same machine skips them. `--profile` traces three steps of ours per case with
jax.profiler and prints where the device time went (kernel classes, the top kernels, kernels per
step, and the share of the device's timeline no kernel fills; every kernel's time goes to
`--out/profile_<case>.json`).

`--variant NAME:OPTION=VALUE,...` (repeatable) also compiles each case's step with those XLA
options (`compiled(compiler_options=...)`, e.g. `triton_off:xla_gpu_enable_triton_gemm=false`)
or config settings (a dotted key: `ln:model.norm_backward=written_out`) and times it in the same
turns as the default compile, one extra row per variant: an A/B of compiler flags or of the
model's formulations in one process, without a second run's setup. `--variant_cases` limits the
variants to some cases (each variant is one more compile of the case: about a minute at
BERT-base size).
"""

from __future__ import annotations

import os

# Before jax starts: leave device memory for PyTorch, which runs in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import argparse  # noqa: E402
import copy  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.train_step import ours, random_batch, recipe_config  # noqa: E402
from benchmarks.train_step_gpt import causal_batch  # noqa: E402
from benchmarks.train_step_seq2seq import seq2seq_batch  # noqa: E402
from bertology import models, validation  # noqa: E402
from bertology.errors import UserError  # noqa: E402

# Dense bf16 peak FLOP/s by device kind (vendor datasheets; without sparsity).
PEAK = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12,
        "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6": 918e12}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    recipe: str  # configs/<recipe>.py
    preset: str
    batch: int
    length: int
    target: int = 0  # seq2seq target length
    predictions: int = 0  # BERT's gathered MLM positions
    backend: str = "auto"
    vocab: int = 0  # 0: the recipe's released vocabulary
    fused_recipe: bool = True  # attention dropout 0, as the fused kernels need; False: the recipe's own
    reference: bool = True  # False: Hugging Face has no config for it

    @property
    def kind(self) -> str:
        return {"bert": "bert", "gpt": "gpt2", "t5": "t5"}[self.recipe]


CASES = (
    Case("bert128", "bert", "base", 32, 128, predictions=20, vocab=30522),
    Case("bert512", "bert", "base", 32, 512, predictions=80, vocab=30522),
    Case("bert512_xla", "bert", "base", 32, 512, predictions=80, vocab=30522, backend="xla"),
    Case("gpt2", "gpt", "gpt2", 16, 1024, vocab=50257),
    # T5's learned bucket bias keeps it on xla (`attention.choose`), so it keeps its recipe's dropout
    Case("t5", "t5", "base", 32, 512, target=128, vocab=32128, fused_recipe=False),
    # the same with attention dropout 0 on cuDNN, which takes the bucket bias and returns its
    # gradient; HF's T5 has one dropout rate for both, so this one has no reference
    Case("t5_cudnn", "t5", "base", 32, 512, target=128, vocab=32128, backend="cudnn", reference=False),
)
SMOKE = (
    Case("bert128", "bert", "tiny", 2, 128, predictions=20, vocab=512),
    Case("gpt2", "gpt", "tiny", 2, 64, vocab=512),
    Case("t5", "t5", "tiny", 2, 64, target=16, vocab=512, fused_recipe=False),
)


def peak_flops(kind: str) -> float | None:
    """The dense bf16 peak of a jax device kind ("NVIDIA H100 80GB HBM3", "TPU v5p"), or None."""
    return next((peak for name, peak in PEAK.items() if name in kind), None)


def versions() -> dict[str, str]:
    """jax, jaxlib and CUDA/cuDNN as jax sees them; torch and transformers."""
    out = {"jax": jax.__version__, "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
           "xla_flags": os.environ.get("XLA_FLAGS", "")}
    try:
        from jax._src.lib import cuda_versions

        if cuda_versions is not None:
            out["cudnn"] = str(cuda_versions.cudnn_get_version())
            out["cuda_runtime"] = str(cuda_versions.cuda_runtime_get_version())
    except (ImportError, AttributeError, RuntimeError):
        pass
    try:
        import torch
        import transformers

        out["torch"], out["transformers"] = torch.__version__, transformers.__version__
        out["torch_cudnn"] = str(torch.backends.cudnn.version())
    except ImportError:
        out["torch"] = "absent"
    return out


def config_of(case: Case, dtype: str, vocab_multiple: int = 1) -> Any:
    """The case's run config: the recipe's preset, bf16 (or `dtype`), no remat, attention dropout
    0 where the case runs a fused kernel, the case's backend, shapes and vocabulary padding."""
    config = recipe_config(case.recipe, case.preset, case.vocab, dtype, "none")
    config.model.attention_backend = case.backend
    config.model.vocab_multiple = vocab_multiple
    if case.fused_recipe:
        config.model.attention_dropout_rate = 0.0
    config.data.max_seq_length = case.length
    if case.predictions:
        config.data.max_predictions_per_seq = case.predictions
    if case.target:
        config.data.max_target_length = case.target
    return config


def batch_of(case: Case, config: Any) -> dict[str, np.ndarray]:
    if case.recipe == "bert":
        return random_batch(models.encoder_config(config.model), case.batch, case.length, case.predictions)
    if case.recipe == "gpt":
        return causal_batch(case.vocab, case.batch, case.length)
    return seq2seq_batch(case.vocab, case.batch, case.length, case.target, start_id=0)


def chosen_backend(case: Case, config: Any) -> str:
    """What `auto` resolves to for the case's main attention (the mask kind its batches have)."""
    from bertology.models.attention import FusedMask, choose

    cfg = models.encoder_config(config.model)
    kind = "causal" if case.recipe == "gpt" else "padding"
    mask = FusedMask(kind=kind, query=np.ones(1), key=np.ones(1), causal=kind == "causal")
    try:
        return choose(case.backend, platform=jax.default_backend(), dtype=cfg.dtype, head_dim=cfg.head_dim, mask=mask,
                      bias=cfg.positions == "relative_bias", dropout=False)[0]
    except Exception as e:  # noqa: BLE001 - reported in the row
        return f"refused: {e}"


def ours_step(config: Any, batch: dict[str, np.ndarray], max_bytes: float | None = None,
              hlo: pathlib.Path | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[Callable[..., None] | None, float, Any]:
    """(one step of ours, returning once done unless called with wait=False; setup seconds: build,
    init, trace, probes and compile; XLA's memory plan for the step, `CompiledMemoryStats` or None
    where the backend has none). The step is None, and never run, where the plan (arguments +
    temporaries) exceeds `max_bytes`. `hlo`: write the compiled program's text there (the fusion
    names the profile's kernels carry). `options`: XLA compiler options for this compile."""
    start = time.perf_counter()
    jitted, state = ours(config, batch)
    device_batch, key = jax.device_put(batch), jax.random.key(0)
    compiled = jitted.lower(state, device_batch, key).compile(compiler_options=options)
    if hlo is not None:
        hlo.parent.mkdir(parents=True, exist_ok=True)
        hlo.write_text(compiled.as_text())
    memory = compiled.memory_analysis()
    if max_bytes is not None and memory is not None and \
            memory.argument_size_in_bytes + memory.temp_size_in_bytes > max_bytes:
        return None, time.perf_counter() - start, memory
    holder: list[Any] = [state, None]

    def step(wait: bool = True) -> None:
        holder[0], holder[1] = compiled(holder[0], device_batch, key)
        if wait:
            jax.block_until_ready(holder)

    step()
    return step, time.perf_counter() - start, memory


def setting(text: str) -> bool | int | float | str:
    """A value written on the command line, for the config or XLA: true/false, a number, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def with_settings(config: Any, settings: dict[str, Any]) -> Any:
    """A copy of the run config (its field references kept) with dotted settings
    ({"model.norm_backward": "written_out"}) applied. A key the config lacks is refused, except
    in `model`, whose fields the recipes leave at their defaults and the trunk's config checks."""
    if not settings:
        return config
    unknown = sorted(k for k in settings if not k.startswith("model.") and validation.get(config, k) is validation.MISSING)
    if unknown:
        raise UserError(f"--variant settings {unknown} name no key of the run config; check the spelling")
    config = copy.deepcopy(config)
    config.update_from_flattened_dict(settings)
    return config


def alternate(steps: list[Callable[..., None]], n: int, warmup: int = 2, chunk: int = 1) -> list[float]:
    """Median seconds per step of each, taking turns after `warmup` steps each: `n` turns of
    `chunk` steps, waiting for the device only at a turn's end. A training run waits only when
    it logs, so with chunk > 1 the host queues the next step while the device runs this one, as
    it does in training; chunk=1 adds the launch latency of every step's first kernels."""
    times: list[list[float]] = [[] for _ in steps]
    for i in range(warmup + n):
        for j, step in enumerate(steps):
            t = time.perf_counter()
            for s in range(chunk if i >= warmup else 1):
                step(wait=s == chunk - 1 or i < warmup)
            if i >= warmup:
                times[j].append((time.perf_counter() - t) / chunk)
    return [float(np.median(t)) for t in times]


def kernel_profile(step: Callable[..., None], steps: int = 3, top: int = 20,
                   dump: pathlib.Path | None = None) -> dict[str, Any]:
    """Where the device time of `steps` steps goes: shares by kernel class, the top kernels, the
    kernel launches per step, and how much of the device's timeline the kernels fill, from
    jax.profiler's Perfetto trace (device events only; empty on CPU). The steps are queued as in
    training (the host waits after the last only), so `device_span_ms_per_step` (first kernel's
    start to last kernel's end, per step) is what the queued step costs the device, and
    `device_idle_share` is the part of that span no kernel runs in: gaps between kernels that
    the host or the launches leave. `dump`: write every kernel's milliseconds per step and
    launches per step there."""
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        for i in range(steps):
            step(wait=i == steps - 1)
        jax.profiler.stop_trace()
        traces = sorted(pathlib.Path(d).rglob("perfetto_trace.json.gz"))
        if not traces:
            return {}
        events = json.loads(gzip.open(traces[-1]).read())
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and any(s in str(e.get("args", {}).get("name", "")) for s in ("GPU", "TPU", "/device:"))}
    kernels: Counter = Counter()
    launches: Counter = Counter()
    intervals = []
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in devices and "dur" in e:
            kernels[e["name"]] += e["dur"]
            launches[e["name"]] += 1
            intervals.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    total = sum(kernels.values())
    if not total:
        return {}
    classes: Counter = Counter()
    for name, dur in kernels.items():
        classes[kernel_class(name)] += dur
    if dump is not None:
        dump.parent.mkdir(parents=True, exist_ok=True)
        dump.write_text(json.dumps([{"kernel": n, "class": kernel_class(n), "ms_per_step": d / steps / 1e3,
                                     "launches_per_step": launches[n] / steps} for n, d in kernels.most_common()]))
    span, busy = timeline(intervals)
    return {"device_ms_per_step": total / steps / 1e3, "kernels_per_step": sum(launches.values()) / steps,
            "device_span_ms_per_step": span / steps / 1e3, "device_idle_share": round(1 - busy / span, 3),
            "classes": {c: round(d / total, 3) for c, d in classes.most_common()},
            "top": [(n[:90], round(d / total, 3)) for n, d in kernels.most_common(top)]}


def timeline(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(span, busy) of [start, end) intervals (at least one): from the first start to the last
    end, and the length of their union (kernels on several streams overlap; counting them twice
    would hide a gap). Meant for GPU kernels: a TPU trace's device lines also hold whole-program
    events, which would fill every gap."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return reach - min(start for start, _ in intervals), busy


def kernel_class(name: str) -> str:
    """A kernel's class by the names cuBLAS, cuDNN, XLA and Pallas give them."""
    n = name.lower()
    for cls, marks in (("attention", ("cudnn", "flash", "fmha", "attention", "splash")),
                       ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "matmul", "dot", "convolution")),
                       ("copy/transpose", ("copy", "memcpy", "transpose", "memset")),
                       ("scatter/gather", ("scatter", "gather", "dynamic")),
                       ("reduction", ("reduce", "reduction")),
                       ("fusion", ("fusion", "loop", "input", "triton"))):
        if any(m in n for m in marks):
            return cls
    return "other"


def measure(case: Case, dtype: str, steps: int, peak: float | None, profile: bool, reference: bool,
            vocab_multiple: int = 1, chunk: int = 5, hlo_dir: pathlib.Path | None = None,
            variants: dict[str, dict[str, Any]] | None = None, out: pathlib.Path | None = None,
            ) -> list[dict[str, Any]]:
    """The case's row, then one row per variant (XLA options and/or config settings, each row with
    its own backend and FLOP count), all timed in the same turns."""
    config = config_of(case, dtype, vocab_multiple)
    batch = batch_of(case, config)
    tokens = batch["input_ids"].size
    shape = f"{case.batch}x{case.length}" + (f"->{case.target}" if case.target else "")
    row: dict[str, Any] = {"case": case.name, "shape": shape, "backend": case.backend, "ran": chosen_backend(case, config),
                           "dtype": dtype, "vocab_multiple": vocab_multiple,
                           "flops_per_token": models.flops_per_token(config)}
    rows = [row] + [{**row, "case": f"{case.name}[{name}]", "options": options} for name, options in (variants or {}).items()]
    steps_of = []
    for r in rows:
        hlo = hlo_dir and hlo_dir / f"{r['case']}.hlo.txt"
        try:
            settings = {k: v for k, v in r.get("options", {}).items() if "." in k}
            options = {k: v for k, v in r.get("options", {}).items() if "." not in k} or None
            varied = with_settings(config, settings)
            if settings:
                r.update(ran=chosen_backend(case, varied), flops_per_token=models.flops_per_token(varied))
            step, r["setup_s"], memory = ours_step(varied, batch, hlo=hlo, options=options)
        except Exception as e:  # noqa: BLE001 - a variant XLA refuses must not lose the others
            if r is row:
                raise
            r["ran"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
            continue
        r["ours_bytes"] = None if memory is None else float(memory.argument_size_in_bytes + memory.temp_size_in_bytes)
        steps_of.append((r, step))
    runs = [step for _, step in steps_of]
    peak_theirs: Callable[[], float | None] = lambda: None  # noqa: E731
    reference = reference and case.reference
    if reference:
        from benchmarks import reference_torch

        start = time.perf_counter()
        theirs, row["hf_attention"], peak_theirs = reference_torch.train_step(
            case.kind, dict(config.model), config.optimizer, batch, bf16=dtype == "bfloat16")
        theirs()
        row["hf_setup_s"] = time.perf_counter() - start
        runs.append(theirs)
    seconds = alternate(runs, steps, chunk=chunk)
    for (r, step), sec in zip(steps_of, seconds):
        r["step_ms"] = sec * 1e3
        r["step_ms_waiting"] = alternate([step], 3)[0] * 1e3  # waiting for every step: the launch latency
        r["tokens_per_s"] = tokens / sec
        r["mfu"] = r["tokens_per_s"] * r["flops_per_token"] / peak if peak else None
        if r is not row:
            r["vs_default"] = seconds[0] / sec
        if profile:
            dump = out and out / f"profile_{r['case']}.json"
            try:
                r["profile"] = kernel_profile(step, dump=dump)
            except Exception as e:  # noqa: BLE001 - a profiler problem must not lose the timing
                r["profile"] = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
    if reference:
        row["hf_tokens_per_s"] = tokens / seconds[-1]
        row["hf_mfu"] = row["hf_tokens_per_s"] * row["flops_per_token"] / peak if peak else None
        row["ratio"] = seconds[-1] / seconds[0]
        row["hf_bytes"] = peak_theirs()
    return rows


COLUMNS = ["case", "shape", "backend", "ran", "tokens_per_s", "mfu", "hf_tokens_per_s", "hf_mfu", "ratio", "step_ms",
           "step_ms_waiting", "setup_s", "ours_bytes", "hf_bytes", "hf_attention", "vs_default"]
FORMATS = {"tokens_per_s": "{:,.0f}", "hf_tokens_per_s": "{:,.0f}", "mfu": "{:.1%}", "hf_mfu": "{:.1%}",
           "ratio": "{:.2f}x", "step_ms": "{:.1f}", "step_ms_waiting": "{:.1f}", "setup_s": "{:.0f}",
           "ours_bytes": "{:.3g}", "hf_bytes": "{:.3g}", "vs_default": "{:.3f}x"}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes in float32: seconds on a CPU")
    p.add_argument("--cases", default=None, help=f"comma-separated, of {[c.name for c in CASES]}")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--peak_flops", type=float, default=None, help="the chip's dense bf16 FLOP/s (default: PEAK)")
    p.add_argument("--no_reference", action="store_true", help="skip Hugging Face PyTorch")
    p.add_argument("--vocab_multiple", type=int, default=1, help="pad our vocabulary to this multiple (128: GPUs, TPUs)")
    p.add_argument("--profile", action="store_true", help="trace 3 steps of ours per case; print the kernel split")
    p.add_argument("--cache_dir", default=None, help="JAX's persistent compilation cache (default: the one "
                   "JAX_COMPILATION_CACHE_DIR names, else ~/.cache/bertology/jax_compile)")
    p.add_argument("--chunk", type=int, default=5, help="steps per turn, waiting for the device at a turn's end only")
    p.add_argument("--hlo", default=None, help="write each case's compiled program text to this directory")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:OPTION=VALUE,...",
                   help="also time each case compiled with these XLA options or config settings (model.KEY=VALUE; "
                        "repeatable)")
    p.add_argument("--variant_cases", default=None, help="comma-separated: run the variants for these cases only")
    p.add_argument("--out", default="runs/benchmarks")
    args = p.parse_args(argv)
    variants = {}
    for spec in args.variant:
        name, _, options = spec.partition(":")
        pairs = [o.partition("=") for o in options.split(",") if o]
        if not name or not pairs or any(not k or not eq for k, eq, _ in pairs):
            p.error(f"--variant {spec!r}: write NAME:OPTION=VALUE[,OPTION=VALUE...]")
        variants[name] = {k: setting(v) for k, _, v in pairs}

    if args.cache_dir or not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir or os.path.expanduser("~/.cache/bertology/jax_compile"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    cases = SMOKE if args.smoke else CASES
    if args.cases:  # in the order given: the first ones are measured even if the run is cut short
        known = {c.name: c for c in cases}
        unknown = [w for w in args.cases.split(",") if w not in known]
        if unknown:
            p.error(f"unknown cases {unknown}; pick from {list(known)}")
        cases = tuple(known[w] for w in args.cases.split(","))
    varied = set(args.variant_cases.split(",")) if args.variant_cases else {c.name for c in cases}
    if not varied <= {c.name for c in cases}:
        p.error(f"--variant_cases {sorted(varied - {c.name for c in cases})} are not among the cases run")
    dtype = "float32" if args.smoke else "bfloat16"
    out = pathlib.Path(args.out)
    info = versions()
    peak = args.peak_flops or peak_flops(info["device"])
    print(json.dumps(info), flush=True)
    rows = []
    for case in cases:
        try:
            measured = measure(case, dtype, 2 if args.smoke else args.steps, peak, args.profile, not args.no_reference,
                               args.vocab_multiple, args.chunk, args.hlo and pathlib.Path(args.hlo),
                               variants if case.name in varied else None, out)
        except Exception as e:  # noqa: BLE001 - one failing case must not lose the others' numbers
            traceback.print_exc()
            measured = [{"case": case.name, "backend": case.backend, "ran": f"failed: {type(e).__name__}: {str(e)[:200]}"}]
        for row in measured:
            row.update(device=info["device"], jax=info["jax"])
        rows.extend(measured)
        report.append(measured, out, "accelerator", COLUMNS, FORMATS)  # case by case: a cut-short run keeps its rows
    with open(out / "accelerator.md", "a") as f:
        f.write(f"\n{json.dumps(info)}; peak {peak or 'unknown'} FLOP/s\n\n")
    return rows


if __name__ == "__main__":
    main()
