"""Convert checkpoints between Hugging Face and bertology run directories.

    python -m bertology.convert --from hf --in HF_DIR --out WORKDIR [--generator HF_GENERATOR_DIR] [--vocab_multiple N]
    python -m bertology.convert --to hf --in WORKDIR --out HF_DIR [--step N]
    python -m bertology.convert --to sentence-transformers --in WORKDIR --out DIR [--step N]

Model types: bert, roberta, albert, electra (our families of the same names), gpt2 and
openai-gpt (our `gpt` family: pre-LN exports as gpt2, post-LN as openai-gpt); the list is
`bertology.interop.records.registry()`.

Import writes a new run directory (config.json, step-0 checkpoint, tokenizer files; built under a
temporary name and renamed into place) that fine-tuning, feature extraction, generation and
export read like a pretraining run; ELECTRA takes its discriminator as --in and, optionally, its
generator as --generator. Export writes model.safetensors, config.json (last), the tokenizer
files, a model card (README.md) and, for a model that generates, generation_config.json
(ELECTRA: HF_DIR/discriminator and HF_DIR/generator); `--to sentence-transformers` adds the
files that make the directory a SentenceTransformer (mean pooling; a causal trunk's last token). `--vocab_multiple N` pads the
imported token table to a multiple of N rows (`model.vocab_multiple`); export always writes the
real rows only. Errors are one line.
"""

from __future__ import annotations

import argparse
import sys

from bertology import cli


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertology.convert", description=__doc__.split("\n\n")[0])
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--from", dest="source", choices=["hf"], help="import a Hugging Face checkpoint")
    direction.add_argument("--to", dest="target", choices=["hf", "sentence-transformers"],
                           help="export a bertology run (sentence-transformers: with its pooling)")
    p.add_argument("--in", dest="inp", metavar="DIR", required=True,
                   help="HF model directory (import) or run directory (export)")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="run directory to create, new or empty (import), or HF directory (export)")
    p.add_argument("--generator", metavar="DIR", help="ELECTRA import: the generator's HF directory")
    p.add_argument("--step", type=int, help="export: the checkpoint step (default: the latest)")
    p.add_argument("--vocab_multiple", type=int, default=1,
                   help="import: pad the token table to a multiple of this many rows (model.vocab_multiple)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def work() -> None:
        from bertology.interop import export_hf, export_sentence_transformers, import_hf

        if args.source:
            report = import_hf(args.inp, args.out, args.generator, args.vocab_multiple)
            print(f"imported {report.model_type} (family {report.family}) into {args.out}; "
                  f"tokenizer: {report.vocab or 'none our tokenizers read'}")
            if report.fresh:
                print(f"not in the checkpoint, freshly initialised: {', '.join(report.fresh)}")
            if report.unused:
                print(f"in the checkpoint, not used: {', '.join(report.unused)}")
        elif args.target == "sentence-transformers":
            print(f"exported {export_sentence_transformers(args.inp, args.out, args.step)}")
        else:
            for directory in export_hf(args.inp, args.out, args.step):
                print(f"exported {directory}")

    return cli.guarded("bertology.convert", work)


if __name__ == "__main__":
    sys.exit(main())
