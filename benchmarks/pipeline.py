"""Input-pipeline throughput alone: tokenized array_record -> segment pairs -> dynamic masking ->
global batches on the devices, in examples/s.

    python -m benchmarks.pipeline [--batch_size 256] [--passes 2]

Runs PretrainingStream exactly as the train loop does (each pass re-pairs the whole corpus,
each batch is masked afresh and assembled with `make_array_from_process_local_data`) for whole
passes, so pairing is counted at its real share. Also prints where the time goes.
"""

from __future__ import annotations

import argparse
import time

import jax
import ml_collections
import numpy as np

from bertology.data import corpus as corpus_lib
from bertology.data import pipeline
from bertology.data.embedded import DEFAULT_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import load_tokenizer
from bertology.train import sharding


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--passes", type=int, default=2)
    args = p.parse_args(argv)
    tokenizer = load_tokenizer(DEFAULT_VOCAB)
    t = time.perf_counter()
    docs = corpus_lib.load_documents(embedded_corpus_path(), tokenizer, DEFAULT_VOCAB)["train"]
    read_s = time.perf_counter() - t
    data = ml_collections.ConfigDict(dict(max_seq_length=args.seq_len, max_predictions_per_seq=20, masked_lm_prob=0.15,
                                          short_seq_prob=0.1, masking="dynamic", dupe_factor=1))
    stream = pipeline.PretrainingStream(docs, tokenizer, data, batch_size=args.batch_size, seed=0)
    mesh_cfg = sharding.mesh_config("dp", (-1, 1))
    mesh, rules = sharding.make_mesh(mesh_cfg), sharding.rules_for(mesh_cfg)

    t = time.perf_counter()
    pairs = pipeline.make_instances(docs, data, tokenizer, np.random.default_rng(0))
    pair_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(20):
        stream.mask(pairs["input_ids"][: args.batch_size], np.random.default_rng(0))
    mask_s = (time.perf_counter() - t) / 20

    rows, device_s = 0, 0.0
    t = time.perf_counter()
    while stream.get_state()["pass"] < args.passes:
        batch = next(stream)
        d = time.perf_counter()
        jax.block_until_ready(sharding.shard_batch(batch, mesh, rules))
        device_s += time.perf_counter() - d
        rows += len(batch["input_ids"])
    total_s = time.perf_counter() - t
    per_pass = len(pairs["input_ids"])
    out = {"examples_per_s": rows / total_s, "examples": rows, "instances_per_pass": per_pass,
           "read_corpus_s": read_s, "pairing_per_pass_s": pair_s, "pairing_examples_per_s": per_pass / pair_s,
           "masking_examples_per_s": args.batch_size / mask_s, "to_device_share": device_s / total_s}
    print(f"end to end: {out['examples_per_s']:,.0f} examples/s ({rows:,} examples, batch {args.batch_size}x{args.seq_len}, "
          f"{args.passes} passes of {per_pass:,})")
    print(f"  reading the tokenized corpus (once): {read_s:.2f} s")
    print(f"  pairing: {pair_s:.2f} s a pass = {out['pairing_examples_per_s']:,.0f} examples/s")
    print(f"  dynamic masking alone: {out['masking_examples_per_s']:,.0f} examples/s")
    print(f"  global batch assembly: {out['to_device_share']:.1%} of the end-to-end time")
    return out


if __name__ == "__main__":
    main()
