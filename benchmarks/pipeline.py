"""Input-pipeline throughput alone: array_record shards -> windows of documents -> segment pairs
-> dynamic masking -> global batches on the devices, in examples/s; then the same for the
causal-LM transform.

    python -m benchmarks.pipeline [--batch_size 256] [--passes 2]

Runs PretrainingStream exactly as the train loop does (documents read by index from the prepared
shards a window at a time, each window re-paired every pass, each batch masked afresh on the
background prefetch thread and assembled with `make_array_from_process_local_data`) for whole
passes, so reading and pairing are counted at their real share. Also prints where the time goes
(pairing and masking timed alone over the whole corpus in memory). The causal stream
(data.objective=causal: documents + eos packed several per row with next-token targets) is timed
the same way, its packing counted per window.
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
    read_s = time.perf_counter() - t  # opening the shards (documents are read as the stream needs them)
    data = ml_collections.ConfigDict(dict(max_seq_length=args.seq_len, max_predictions_per_seq=20, masked_lm_prob=0.15,
                                          short_seq_prob=0.1, masking="dynamic", dupe_factor=1))
    stream = pipeline.PretrainingStream([docs], tokenizer, data, batch_size=args.batch_size, seed=0)
    mesh_cfg = sharding.mesh_config("dp", (-1, 1))
    mesh, rules = sharding.make_mesh(mesh_cfg), sharding.rules_for(mesh_cfg)

    in_memory = list(docs)
    t = time.perf_counter()
    pairs = pipeline.make_instances(in_memory, data, tokenizer, np.random.default_rng(0))
    pair_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(20):
        stream.transform.corrupt({"input_ids": pairs["input_ids"][: args.batch_size]}, np.random.default_rng(0))
    mask_s = (time.perf_counter() - t) / 20

    rows, total_s, device_s = _run(stream, args.passes, mesh, rules)
    per_pass = len(pairs["input_ids"])

    causal_data = ml_collections.ConfigDict(dict(objective="causal", max_seq_length=args.seq_len))
    t = time.perf_counter()
    causal_pass = len(pipeline.make_instances(in_memory, causal_data, tokenizer, np.random.default_rng(0))["input_ids"])
    causal_pack_s = time.perf_counter() - t
    causal = pipeline.PretrainingStream([docs], tokenizer, causal_data, batch_size=args.batch_size, seed=0)
    causal_rows, causal_s, _ = _run(causal, args.passes, mesh, rules)
    out = {"examples_per_s": rows / total_s, "examples": rows, "instances_per_pass": per_pass,
           "read_corpus_s": read_s, "pairing_per_pass_s": pair_s, "pairing_examples_per_s": per_pass / pair_s,
           "masking_examples_per_s": args.batch_size / mask_s, "to_device_share": device_s / total_s,
           "causal_examples_per_s": causal_rows / causal_s, "causal_rows_per_pass": causal_pass,
           "causal_packing_per_pass_s": causal_pack_s}
    print(f"end to end: {out['examples_per_s']:,.0f} examples/s ({rows:,} examples, batch {args.batch_size}x{args.seq_len}, "
          f"{args.passes} passes of {per_pass:,})")
    print(f"  opening the tokenized corpus: {read_s:.2f} s")
    print(f"  pairing: {pair_s:.2f} s a pass = {out['pairing_examples_per_s']:,.0f} examples/s")
    print(f"  dynamic masking alone: {out['masking_examples_per_s']:,.0f} examples/s")
    print(f"  global batch assembly: {out['to_device_share']:.1%} of the end-to-end time")
    print(f"causal LM end to end: {out['causal_examples_per_s']:,.0f} examples/s ({causal_rows:,} examples, "
          f"{args.passes} passes of {causal_pass:,} packed rows; packing {causal_pack_s:.2f} s a pass)")
    return out


def _run(stream: pipeline.PretrainingStream, passes: int, mesh: jax.sharding.Mesh,
         rules: sharding.Rules) -> tuple[int, float, float]:
    """Rows taken, total seconds and seconds spent assembling device batches, over whole passes."""
    rows, device_s = 0, 0.0
    t = time.perf_counter()
    while stream.get_state()["corpora"][0]["pass"] < passes:
        batch = next(stream)
        d = time.perf_counter()
        jax.block_until_ready(sharding.shard_batch(batch, mesh, rules))
        device_s += time.perf_counter() - d
        rows += len(batch["input_ids"])
    return rows, time.perf_counter() - t, device_s


if __name__ == "__main__":
    main()
