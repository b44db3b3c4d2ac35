"""Corpus preparation as an Apache Beam pipeline, for corpora past one machine.

The same plan (`prepare.plan`: tasks of ~4 MiB that end at document boundaries) and the same
per-task function (`prepare.run_task`: tokenize, write shard `shard-{task:05d}.array_record`) as
the multi-process path, run by Beam instead of a process pool: one code path for the work, two
engines, so the shards are the same bytes (tests/test_beam_prepare.py). Beam adds what one
machine lacks: hundreds of workers, retries of failed tasks (a rerun task rewrites its whole
shard) and a runner for every cluster (Dataflow, Spark, Flink; DirectRunner locally).

The output directory is a prepared corpus: training reads it as is with
`--config.data.corpus=DIR` (a local directory; copy it down from a bucket first), and refuses it
when the run's vocabulary differs from the one it was tokenized with.

Locally (DirectRunner, worker processes on this machine):

    python -m bertology.data.beam --corpus data/wiki/ --vocab vocab.txt --out prepared/wiki

On Dataflow (`pip install '.[beam]'` on the launching machine: Beam with its Dataflow runner; the corpus, and the output, in a
bucket; the workers install bertology from its sdist):

    python -m build --sdist
    python -m bertology.data.beam --corpus gs://BUCKET/wiki/ --vocab vocab.txt \\
        --out gs://BUCKET/prepared/wiki -- \\
        --runner=DataflowRunner --project=PROJECT --region=REGION \\
        --temp_location=gs://BUCKET/tmp --extra_packages=dist/bertology-0.1.0.tar.gz \\
        --max_num_workers=100
    gsutil -m cp -r gs://BUCKET/prepared/wiki /data/   # then --config.data.corpus=/data/wiki
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Sequence

from etils import epath

from bertology import cli
from bertology.data import prepare as prepare_lib
from bertology.data.tokenizers import Tokenizer
from bertology.errors import UserError


def _beam():
    try:
        import apache_beam
    except ImportError as e:
        raise UserError("the Beam preparation path needs apache-beam; pip install 'bertology[beam]'") from e
    return apache_beam


def _write_shard(index: int, task: prepare_lib.Task, tokenizer: Tokenizer, out_dir: str) -> int:
    """`prepare.run_task` into `out_dir`; array_record writes local files only, so a bucket's
    shard is written to a local temporary directory and copied up."""
    if "://" not in out_dir:
        return prepare_lib.run_task(index, task, tokenizer, out_dir)
    with tempfile.TemporaryDirectory() as local:
        n = prepare_lib.run_task(index, task, tokenizer, local)
        name = prepare_lib.shard_name(index)
        epath.Path(local, name).copy(epath.Path(out_dir) / name, overwrite=True)
    return n


def prepare_beam(tasks: Sequence[prepare_lib.Task], tokenizer: Tokenizer, out_dir: str | os.PathLike, *,
                 tokenizer_digest: str = "", pipeline_args: Sequence[str] = ()) -> dict:
    """Tokenize `tasks` into `out_dir` (local or `gs://`) with a Beam pipeline run by the runner
    that `pipeline_args` name (default DirectRunner), then write META, as `prepare.prepare` does.
    Returns the metadata."""
    beam = _beam()
    from apache_beam.options.pipeline_options import PipelineOptions

    out = str(out_dir)
    epath.Path(out).mkdir(parents=True, exist_ok=True)
    start = time.time()  # wall clock: META is written on a worker
    options = PipelineOptions(list(pipeline_args))
    with beam.Pipeline(options=options) as pipeline:
        counts = (
            pipeline
            | "tasks" >> beam.Create(list(enumerate(tasks)))
            | "spread" >> beam.Reshuffle()  # one task per worker slot, not all on the worker that made the list
            | "tokenize" >> beam.MapTuple(lambda i, task: (i, _write_shard(i, task, tokenizer, out)))
            | "gather" >> beam.combiners.ToList()
        )
        counts | "meta" >> beam.Map(_write_meta, tasks, out, tokenizer_digest, start)
    return json.loads((epath.Path(out) / prepare_lib.META).read_text())


def _write_meta(counts: list[tuple[int, int]], tasks: Sequence[prepare_lib.Task], out_dir: str, digest: str,
                start: float) -> None:
    """META, written once every shard is (a reader never sees a half-prepared corpus)."""
    by_task = dict(counts)
    meta = prepare_lib.metadata(tasks, [by_task[i] for i in range(len(tasks))], time.time() - start, digest,
                                engine="beam")
    (epath.Path(out_dir) / prepare_lib.META).write_text(json.dumps(meta))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: the corpus, vocabulary and output; Beam's options after `--`. Bad input is
    one line on stderr and exit status 2."""
    from bertology.data import corpus as corpus_lib
    from bertology.data.tokenizers import load_tokenizer

    p = argparse.ArgumentParser(prog="bertology.data.beam", description=__doc__.splitlines()[0])
    p.add_argument("--corpus", required=True, help="text / JSON-lines file or directory (local or gs://), or "
                                                   "tfds:NAME@DATA_DIR")
    p.add_argument("--vocab", required=True, help="the tokenizer training will use (vocab.txt, .model, vocab.json)")
    p.add_argument("--out", required=True, help="output directory (local or gs://)")
    args, pipeline_args = p.parse_known_args(argv)
    pipeline_args = [a for a in pipeline_args if a != "--"]
    corpus = args.corpus

    def work() -> None:
        if "://" in corpus:
            root = epath.Path(corpus)
            files = sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else [root]
        else:
            files = corpus_lib.corpus_files(corpus)
        tasks = prepare_lib.plan(corpus, files)
        meta = prepare_beam(tasks, load_tokenizer(args.vocab), args.out,
                            tokenizer_digest=corpus_lib.tokenizer_digest(args.vocab), pipeline_args=pipeline_args)
        print(f"{sum(meta['documents'])} documents in {len(meta['shards'])} shards in {args.out} "
              f"({meta['bytes'] / 1e6:.1f} MB in {meta['seconds']:.1f} s)")

    return cli.guarded(p.prog, work)


if __name__ == "__main__":
    sys.exit(main())
