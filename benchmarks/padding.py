"""Padding fraction of the embedded corpus: one document per row against packed rows.

    python -m benchmarks.padding [--seq_len 128]

Also shows BERT's segment-pair rows (data/examples.py) at the same length, for reference.
"""

from __future__ import annotations

import argparse

import ml_collections
import numpy as np

from bertology.data import corpus as corpus_lib
from bertology.data import packing, pipeline
from bertology.data.embedded import DEFAULT_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import load_tokenizer


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq_len", type=int, default=128)
    args = p.parse_args(argv)
    tokenizer = load_tokenizer(DEFAULT_VOCAB)
    docs = corpus_lib.load_documents(embedded_corpus_path(), tokenizer, DEFAULT_VOCAB)["train"]
    pieces = packing.document_pieces(docs, args.seq_len, tokenizer.cls_id, tokenizer.sep_id)
    alone = packing.one_per_row(pieces, args.seq_len, tokenizer.pad_id)
    packed = packing.pack(pieces, args.seq_len, tokenizer.pad_id)
    data = ml_collections.ConfigDict(dict(max_seq_length=args.seq_len, short_seq_prob=0.1))
    pairs = pipeline.make_instances(docs, data, tokenizer, np.random.default_rng(0))
    out = {
        "documents": len(docs),
        "one document per row": packing.padding_fraction(alone["input_mask"]),
        "packed": packing.padding_fraction(packed["input_mask"]),
        "BERT segment pairs": packing.padding_fraction(pairs["input_mask"]),
    }
    print(f"| layout (seq {args.seq_len}) | rows | padding |\n|---|---|---|")
    for name, rows in (("one document per row", alone), ("packed", packed), ("BERT segment pairs", pairs)):
        print(f"| {name} | {len(rows['input_mask']):,} | {out[name]:.1%} |")
    return out


if __name__ == "__main__":
    main()
