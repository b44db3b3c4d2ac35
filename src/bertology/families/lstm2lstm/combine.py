"""An LSTM2LSTM run from two LSTM language-model runs (Ramachandran, Liu & Le 2017, §2.1): the
source LM's embedding and LSTM layers start the encoder, the target LM's embedding, LSTM layers and
softmax start the decoder, and the layers above them and the attention are fresh. Seq2seq
fine-tuning then starts from the written run:

    python -m bertology.pretrain --config configs/lstm_lm.py:tiny --config.model.n_layers=1 --workdir runs/lm_source
    python -m bertology.pretrain --config configs/lstm_lm.py:tiny --config.model.n_layers=1 --config.seed=1 \\
        --workdir runs/lm_target
    python -m bertology.families.lstm2lstm.combine --source runs/lm_source --target runs/lm_target --to runs/lstm2lstm
    python -m bertology.finetune --config configs/lstm2lstm.py:embedded --config.init_checkpoint=runs/lstm2lstm ...

The paper's LMs have one layer (`--config.model.n_layers=1`); a deeper LM's whole stack becomes
each side's lower layers (`model.lm_layers`). `--n_layers` is each side's depth (default one fresh
layer above the LM's). For summarisation the paper pretrains one LM for both sides: pass the same
run as --source and --target.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

from bertology import cli
from bertology.errors import UserError
from bertology.families.gpt2gpt.combine import arguments, fresh_params
from bertology.families.lstm2lstm.model import config
from bertology.train.checkpoint import check_shapes


def block_of(source: dict[str, Any], target: dict[str, Any], n_layers: int | None = None) -> dict[str, Any]:
    """The LSTM2LSTM model block of two LSTM LM runs' blocks, which must be the same network:
    their layers are `lm_layers`, each side has `n_layers` (None: one more)."""
    for side, block in (("--source", source), ("--target", target)):
        if block.get("family") != "lstm" or block.get("kind", "lm") != "lm":
            raise UserError(f"{side} must be an LSTM language-model run (configs/lstm_lm.py), not "
                            f"model.family={block.get('family')!r} with model.kind={block.get('kind')!r}")
    differ = sorted(k for k in set(source) | set(target) if source.get(k) != target.get(k))
    if differ:
        raise UserError(f"the two LSTM LM runs' model blocks differ in {differ}; pretrain both from one "
                        "configs/lstm_lm.py preset")
    lm_layers = source["n_layers"]
    block = {**{k: v for k, v in source.items() if k != "kind"}, "family": "lstm2lstm", "lm_layers": lm_layers,
             "n_layers": lm_layers + 1 if n_layers is None else n_layers}
    config(block)  # refuses n_layers <= lm_layers in one line
    return block


def combine(source: dict, target: dict, fresh: dict) -> dict:
    """LSTM2LSTM parameters: `source`'s LM (embedding, layers, output bias) as the encoder's LM,
    `target`'s as the decoder's, the rest from `fresh`."""
    params = {**fresh, "source": source, "target": target}
    check_shapes(params, fresh, pathlib.Path("the two LSTM LM runs"))
    return params


def main(argv: list[str] | None = None) -> int:
    from bertology.interop.hf import run_tokenizer_files, write_run
    from bertology.train.checkpoint import load_params

    parser = arguments("bertology.families.lstm2lstm.combine", __doc__, "LSTM LM", "LSTM2LSTM", "layers and attention")
    parser.add_argument("--n_layers", type=int, default=None, help="LSTM layers on each side (default: the LM's + 1)")
    args = parser.parse_args(argv)

    def work() -> None:
        (src, src_config), (tgt, tgt_config) = load_params(args.source), load_params(args.target)
        block = block_of(src_config["model"], tgt_config["model"], args.n_layers)
        vocab = src_config["data"].get("vocab")
        if vocab != tgt_config["data"].get("vocab"):
            raise UserError("the two LSTM LM runs have different data.vocab; seq2seq fine-tuning reads one vocabulary, "
                            "so pretrain both on one")
        params = combine(src, tgt, fresh_params(block, args.seed))
        write_run(args.to, block, params, run_tokenizer_files(vocab))
        print(f"wrote {args.to}: encoder from {args.source}, decoder and softmax from {args.target}, "
              f"{block['n_layers'] - block['lm_layers']} fresh layer(s) and the attention")

    return cli.guarded(parser.prog, work)


if __name__ == "__main__":
    sys.exit(main())
