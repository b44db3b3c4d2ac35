"""Corpus scale: preparation MB/s by worker count, and peak memory and time to first batch of
the tiny BERT config as the embedded corpus is repeated x1, x10, x100.

    python -m benchmarks.corpus_scale prepare [--copies 10] [--workers 1 2]
    python -m benchmarks.corpus_scale first_batch --copies 1 10 100

`prepare` tokenizes a directory of `copies` copies of the embedded corpus (one file each) into a
fresh cache per worker count and prints MB/s. `first_batch` runs, per size, `bertology.pretrain
--config configs/bert.py:tiny --config.total_steps=1` under /usr/bin/time once to prepare the corpus
(cold) and once more on the prepared corpus (warm), printing each run's peak RSS, and the time
from the start of `train` to its first batch (corpus opened, stream made, evaluation batches and
the first training batch built) in a fresh process. Set PYTHONPATH to another checkout's src to
measure that one (the "before" column).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
_FIRST_BATCH = """
import sys, time
sys.path.insert(0, {configs!r})
import bert
from bertology.data import corpus as corpus_lib, pipeline
from bertology.data.tokenizers import load_tokenizer
from bertology.data.embedded import DEFAULT_VOCAB
c = bert.get_config("tiny")
tok = load_tokenizer(DEFAULT_VOCAB)
t = time.perf_counter()
docs = corpus_lib.load_documents({corpus!r}, tok, DEFAULT_VOCAB, {cache!r}, log=lambda m: None)
stream = pipeline.PretrainingStream([docs["train"]], tok, c.data, batch_size=c.batch_size, seed=c.seed)
pipeline.eval_batches([docs["validation"]], tok, c.data, batch_size=c.batch_size, num_batches=c.eval_batches, seed=c.seed)
next(stream)
print("first_batch_s", time.perf_counter() - t)
"""


def corpus_copies(root: pathlib.Path, copies: int) -> pathlib.Path:
    """A directory of `copies` files, each the embedded corpus."""
    from bertology.data.embedded import embedded_corpus_path

    out = root / f"x{copies}"
    if not out.exists():
        out.mkdir(parents=True)
        text = embedded_corpus_path().read_bytes()
        for i in range(copies):
            (out / f"part-{i:04d}.txt").write_bytes(text)
    return out


def prepare(root: pathlib.Path, copies: int, workers: list[int]) -> dict[int, float]:
    from bertology.data import corpus as corpus_lib
    from bertology.data import prepare as prepare_lib
    from bertology.data.embedded import DEFAULT_VOCAB
    from bertology.data.tokenizers import load_tokenizer

    corpus = corpus_copies(root, copies)
    tok = load_tokenizer(DEFAULT_VOCAB)
    tasks = prepare_lib.plan(corpus, corpus_lib.corpus_files(corpus))
    rates = {}
    for n in workers:
        t, cpu = time.perf_counter(), _cpu_seconds()
        meta = prepare_lib.prepare(tasks, tok, root / f"prepared-{copies}-{n}", workers=n, progress=False)
        seconds, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
        rates[n] = meta["bytes"] / 1e6 / seconds
        print(f"x{copies} ({meta['bytes'] / 1e6:.1f} MB, {len(tasks)} tasks), {n} worker(s): {seconds:.1f} s, "
              f"{rates[n]:.2f} MB/s; {cpu:.1f} CPU s = {meta['bytes'] / 1e6 / cpu:.2f} MB per CPU s "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if len(rates) > 1:
        print(f"speed-up {max(workers)} vs {min(workers)} workers: {rates[max(workers)] / rates[min(workers)]:.2f}x")
    return rates


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (the workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(args: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in MB and output of a command under /usr/bin/time -v."""
    t = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-v", *args], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1)) / 1024
    return wall, rss, out.stdout


def first_batch(root: pathlib.Path, copies: int) -> dict[str, float]:
    corpus = corpus_copies(root, copies)
    cache = root / f"cache-{copies}"
    shutil.rmtree(cache, ignore_errors=True)
    row = {}
    for phase in ("cold", "warm"):
        work = root / f"run-{copies}-{phase}"
        shutil.rmtree(work, ignore_errors=True)
        wall, rss, _ = _timed([sys.executable, "-m", "bertology.pretrain", f"--config={REPO}/configs/bert.py:tiny",
                               f"--workdir={work}", "--config.total_steps=1", "--config.eval_every=0",
                               f"--config.data.corpus={corpus}", f"--config.data.cache_dir={cache}"])
        row[f"{phase}_run_s"], row[f"{phase}_peak_rss_mb"] = wall, rss
    script = _FIRST_BATCH.format(configs=str(REPO / "configs"), corpus=str(corpus), cache=str(cache))
    _, rss, out = _timed([sys.executable, "-c", script])
    row["first_batch_s"] = float(out.split("first_batch_s")[1])
    row["data_only_peak_rss_mb"] = rss
    print(f"x{copies}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["prepare", "first_batch"])
    p.add_argument("--copies", type=int, nargs="+", default=[10])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--root", default=None, help="scratch directory (default: a temporary one)")
    args = p.parse_args(argv)
    root = pathlib.Path(args.root or tempfile.mkdtemp(prefix="corpus_scale_"))
    for copies in args.copies:
        if args.what == "prepare":
            prepare(root, copies, args.workers)
        else:
            first_batch(root, copies)


if __name__ == "__main__":
    main()
