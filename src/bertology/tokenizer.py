"""Command line: train a tokenizer, or show how a trained one splits some text.

    python -m bertology.tokenizer --vocab_size 8192 --kind wordpiece --out vocab.txt
    python -m bertology.tokenizer --corpus texts/ --vocab_size 32000 --kind unigram --out sp.model
    python -m bertology.tokenizer --corpus texts/ --vocab_size 50257 --kind bytebpe --out gpt2_bpe/
    python -m bertology.tokenizer --vocab vocab.txt --text "Hello, world!"

Without --corpus, training uses the embedded corpus (the standard library's docstrings).
"""

from __future__ import annotations

import argparse
import sys
import time

from bertology import cli
from bertology.data.corpus import check_text
from bertology.data.embedded import embedded_corpus_path
from bertology.data.tokenizers import load_tokenizer
from bertology.data.tokenizers.train import BYTE_BPE_SPECIALS, KINDS, SPECIALS, corpus_files, train_tokenizer

_PROG = "bertology.tokenizer"


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (2 on bad input, after a one-line message)."""
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.split("\n")[0])
    train = parser.add_argument_group("train a tokenizer")
    train.add_argument("--corpus", help="text file or directory of .txt files (default: embedded)")
    train.add_argument("--vocab_size", type=int, help="number of entries, specials included")
    train.add_argument("--kind", choices=KINDS)
    train.add_argument("--out", help="output path: .txt for wordpiece, .model for unigram/bpe, a directory for bytebpe")
    train.add_argument("--cased", action="store_true", help="keep case (default: lower-case; bytebpe always keeps it)")
    train.add_argument("--specials", choices=sorted({*SPECIALS, *BYTE_BPE_SPECIALS}),
                       help="special tokens: albert ([CLS] [SEP] [MASK], unigram/bpe default), gpt2 "
                            "(<|endoftext|>, bytebpe default) or roberta (<s> </s> <mask>)")
    show = parser.add_argument_group("tokenize some text")
    show.add_argument("--vocab", help="a vocab.txt, a .model file or a byte-level BPE directory")
    show.add_argument("--text")
    args = parser.parse_args(argv)

    def work() -> None:
        if args.vocab is not None or args.text is not None:
            if args.vocab is None or args.text is None:
                parser.error("--vocab and --text go together")
            tokenizer = load_tokenizer(args.vocab)
            print(" ".join(tokenizer.tokenize(args.text)))
            print(" ".join(map(str, tokenizer.encode(args.text))))
            return
        missing = [f"--{n}" for n in ("vocab_size", "kind", "out") if getattr(args, n) is None]
        if missing:
            parser.error(f"training needs {' '.join(missing)} (or pass --vocab and --text)")
        start = time.perf_counter()
        corpus = args.corpus if args.corpus is not None else embedded_corpus_path()
        check_text(corpus_files(corpus))
        path = train_tokenizer(
            corpus, args.vocab_size, args.kind, args.out, do_lower_case=False if args.cased else None,
            specials=args.specials,
        )
        print(f"wrote {path} ({args.kind}, {args.vocab_size} entries) "
              f"in {time.perf_counter() - start:.1f}s")

    return cli.guarded(_PROG, work)


if __name__ == "__main__":
    sys.exit(main())
