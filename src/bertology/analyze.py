"""Looking inside a checkpoint, layer by layer: how contextual a word's vectors are, where each
head looks, and what a linear probe can read off each layer.

    python -m bertology.analyze similarity --checkpoint runs/tiny --word broke --input sentences.txt
    python -m bertology.analyze attention --checkpoint runs/tiny --input sentences.txt [--show 1]
    python -m bertology.analyze probe --checkpoint runs/tiny --kind tokens --train train.txt --test valid.txt \
        [--column -1]
    python -m bertology.analyze probe --checkpoint runs/tiny --kind sentences --train train.tsv --test dev.tsv \
        [--text_column sentence] [--label_column label]
    python -m bertology.analyze curves --runs scratch=runs/ft_scratch pretrained=runs/ft_tiny [--metric loss]
    python -m bertology.analyze surface --checkpoint runs/ft_tiny [--points 20] [--grid 5] [--span 1.0] [--rows 1024]

Every tool takes [--out DIR] (default CHECKPOINT/analysis) and [--max_seq_length 128], reads the
layers of the trunk fine-tuning uses (any family's checkpoint: BERT-style encoders, GPT, the T5
encoder), and writes a JSON file of its numbers and PNG plots:
- `similarity` (Ethayarajh 2019; `bertology.analysis.similarity`): self-similarity, anisotropy
  and their difference by layer -> similarity_<word>.json and .png;
- `attention` (Clark et al. 2019; `bertology.analysis.attention`): per-head attention to
  [CLS]/[SEP]/punctuation/the neighbours and entropy -> attention.json, attention_heads.png,
  and every head's map of sentence --show -> attention_sentence<N>.png;
- `probe` (linear probes with Hewitt & Liang's control task; `bertology.analysis.probe`):
  held-out accuracy by layer -> probe_<kind>.json and .png;
- `curves` (`bertology.analysis.curves`): several runs' logged metric on one plot (fine-tuning
  from a pretrained run against from scratch, Hao et al. 2019) -> curves_<metric>.json and .png
  (--out defaults to the first run's analysis/; it reads metrics.jsonl, not checkpoints);
- `surface` (Hao et al. 2019; `bertology.analysis.surface`): a fine-tuning run's training loss
  from its start to its end and on a random filter-normalised plane around its end ->
  surface.json, surface_1d.png and surface_2d.png.
Errors are one line.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

import numpy as np

from bertology import cli
from bertology.errors import UserError
from bertology.files import atomic_write


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertology.analyze", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="tool", required=True)

    def tool(name: str, help: str) -> argparse.ArgumentParser:
        t = sub.add_parser(name, help=help)
        t.add_argument("--checkpoint", required=True, help="a run directory (config.json + checkpoints/)")
        t.add_argument("--out", help="where the .json and .png files go (default: CHECKPOINT/analysis)")
        t.add_argument("--max_seq_length", type=int, default=128)
        return t

    s = tool("similarity", "self-similarity and anisotropy of a word's vectors by layer")
    s.add_argument("--word", required=True, help="the word to follow across the sentences")
    s.add_argument("--input", required=True, help="a text file, one sentence per line, each using the word")
    a = tool("attention", "every head's attention maps and Clark et al.'s per-head statistics")
    a.add_argument("--input", required=True, help="a text file, one sentence per line")
    a.add_argument("--show", type=int, default=1, help="the sentence (1-based line) whose maps are plotted")
    r = tool("probe", "held-out accuracy of a linear probe on each layer")
    r.add_argument("--kind", required=True, choices=("tokens", "sentences"))
    r.add_argument("--train", required=True, help="tokens: a CoNLL-style column file; sentences: a TSV with a header")
    r.add_argument("--test", required=True, help="the held-out file, in the same format")
    r.add_argument("--column", type=int, default=-1, help="tokens: the tag's column (-1: the last, NER in CoNLL-2003)")
    r.add_argument("--text_column", default="sentence", help="sentences: the text's column")
    r.add_argument("--label_column", default="label", help="sentences: the label's column")
    f = tool("surface", "a fine-tuning run's training loss from start to end and around its end")
    f.add_argument("--points", type=int, default=20, help="steps from start to end (and a quarter beyond each)")
    f.add_argument("--grid", type=int, default=5, help="steps from the plane's centre to each edge")
    f.add_argument("--span", type=float, default=1.0, help="the plane's half-width, in filter-normalised units")
    f.add_argument("--rows", type=int, default=1024, help="the training rows the loss is over (the first N; 0: all)")
    c = sub.add_parser("curves", help="several runs' logged metric on one plot")
    c.add_argument("--runs", required=True, nargs="+", help="LABEL=WORKDIR for each run, e.g. scratch=runs/a")
    c.add_argument("--metric", default="loss", help="a key of the runs' metrics.jsonl")
    c.add_argument("--smooth", type=int, default=20, help="the moving average's window, in logged steps")
    c.add_argument("--out", help="where the .json and .png go (default: the first run's analysis/)")
    return p


def _lines(path: str) -> list[str]:
    file = pathlib.Path(path)
    if not file.is_file():
        raise UserError(f"input file not found: {file}; give a text file with one sentence per line")
    return [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


def _similarity(args: argparse.Namespace, out: pathlib.Path) -> None:
    from bertology.analysis import similarity

    result = similarity.self_similarity(args.checkpoint, _lines(args.input), args.word,
                                        max_seq_length=args.max_seq_length)
    name = "".join(c if c.isalnum() else "_" for c in args.word)
    atomic_write(out / f"similarity_{name}.json", json.dumps(result, indent=2))
    similarity.plot(result, out / f"similarity_{name}.png")
    for r in result["layers"]:
        print(f"layer {r['layer']:2d}: self-similarity {r['self_similarity']:.3f} | anisotropy "
              f"{r['anisotropy']:.3f} | adjusted {r['adjusted']:.3f}")
    print(f"wrote {out}/similarity_{name}.json and .png")


def _attention(args: argparse.Namespace, out: pathlib.Path) -> None:
    from bertology.analysis import attention

    result = attention.head_summary(args.checkpoint, _lines(args.input), max_seq_length=args.max_seq_length,
                                    show=args.show)
    atomic_write(out / "attention.json", json.dumps({k: v for k, v in result.items() if k != "shown"}, indent=2))
    attention.plot_heads(result, out / "attention_heads.png")
    attention.plot_maps(result, out / f"attention_sentence{args.show}.png")
    stats = result["statistics"]
    for layer in range(result["layers"]):
        print(f"layer {layer + 1:2d}: " + " | ".join(f"{name} {np.mean(stats[name][layer]):.3f}"
                                                    for name in attention.STATISTICS) + " (means over heads)")
    print(f"wrote {out}/attention.json, attention_heads.png and attention_sentence{args.show}.png")


def _probe(args: argparse.Namespace, out: pathlib.Path) -> None:
    from bertology.analysis import probe

    def read(path: str) -> tuple[Any, Any]:
        if args.kind == "tokens":
            return probe.read_tokens(pathlib.Path(path), args.column)
        return probe.read_sentences(pathlib.Path(path), args.text_column, args.label_column)

    result = probe.accuracy_by_layer(args.checkpoint, args.kind, read(args.train), read(args.test),
                                     max_seq_length=args.max_seq_length)
    result.update(train=args.train, test=args.test)
    atomic_write(out / f"probe_{args.kind}.json", json.dumps(result, indent=2))
    title = f"{pathlib.Path(args.train).name}: {len(result['labels'])} labels"
    probe.plot(result, title, out / f"probe_{args.kind}.png")
    for r in result["layers"]:
        extra = f" | control {r['control']:.3f} | selectivity {r['selectivity']:.3f}" if "control" in r else ""
        print(f"layer {r['layer']:2d}: accuracy {r['accuracy']:.3f}{extra}")
    print(f"majority label: {result['majority']:.3f}; wrote {out}/probe_{args.kind}.json and .png")


def _curves(args: argparse.Namespace, out: pathlib.Path) -> None:
    from bertology.analysis import curves

    runs = {}
    for item in args.runs:
        label, sep, run = item.partition("=")
        if not sep or not label or not run:
            raise UserError(f"--runs {item!r} is not LABEL=WORKDIR; e.g. --runs scratch=runs/a pretrained=runs/b")
        runs[label] = pathlib.Path(run)
    if args.smooth < 1:
        raise UserError(f"--smooth={args.smooth}; the moving average needs a window of at least 1 step")
    read = curves.read(runs, args.metric)
    name = "".join(c if c.isalnum() else "_" for c in args.metric)
    summary = curves.summary(read, args.smooth)
    atomic_write(out / f"curves_{name}.json", json.dumps({"metric": args.metric, "runs": {k: str(v) for k, v in runs.items()},
                                                           "summary": summary, "curves": read}, indent=2))
    curves.plot(read, args.metric, args.smooth, out / f"curves_{name}.png")
    for label, s in summary.items():
        print(f"{label}: {args.metric} {s['first']:.4f} -> {s['last']:.4f} over {s['steps']:.0f} steps "
              f"(means of {args.smooth} logged steps)")
    print(f"wrote {out}/curves_{name}.json and .png")


def _surface(args: argparse.Namespace, out: pathlib.Path) -> None:
    from bertology.analysis import surface

    result = surface.surfaces(args.checkpoint, points=args.points, grid=args.grid, span=args.span,
                              rows=args.rows or None)
    atomic_write(out / "surface.json", json.dumps(result, indent=2))
    surface.plot(result, f"{pathlib.Path(args.checkpoint).name}: {result['training_rows']} training rows",
                 out / "surface_1d.png", out / "surface_2d.png")
    line = dict(zip(result["alphas"], result["line"]))
    middle = result["plane"][len(result["plane"]) // 2][len(result["plane"]) // 2]
    print(f"training loss at the start {line[0.0]:.4f}, at the end {line[1.0]:.4f}; plane: {np.min(result['plane']):.4f}"
          f"..{np.max(result['plane']):.4f} (centre {middle:.4f})")
    print(f"wrote {out}/surface.json, surface_1d.png and surface_2d.png")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    first = args.runs[0].partition("=")[2] if args.tool == "curves" else args.checkpoint
    out = pathlib.Path(args.out or pathlib.Path(first) / "analysis")
    tools = {"similarity": _similarity, "attention": _attention, "probe": _probe, "curves": _curves,
             "surface": _surface}
    return cli.guarded("bertology.analyze", lambda: tools[args.tool](args, out))


if __name__ == "__main__":
    sys.exit(main())
