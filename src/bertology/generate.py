"""Continue prompts with a causal LM run (configs/gpt.py), or map sources to targets with an
encoder-decoder (BART, T5, MASS) or UniLM run: greedy, sampled or beam search.

    python -m bertology.generate --checkpoint runs/gpt_tiny --prompt "Return the" [--prompt ...] \\
        [--max_new_tokens 50 --temperature 0 --top_k 0 --top_p 1 --num_samples 1 --seed 0]
    python -m bertology.generate --checkpoint runs/s2s_bart --source "Return the sum of a and b." \\
        [--num_beams 4 --length_penalty 1.0]

Prints, for each prompt (source) and sample, a `>>> prompt` line and then the continuation
(target), up to the tokenizer's end token. All inputs and samples run as one batch; samples of
one input differ because every row draws its own tokens. Bad input ends with one line and exit
status 2.
"""

from __future__ import annotations

import sys

from absl import flags

from bertology import cli
from bertology.errors import UserError


def _flags() -> flags.FlagValues:
    fv = flags.FlagValues()
    flags.DEFINE_string("checkpoint", None, "A run directory (config.json + checkpoints/): causal LM, "
                        "encoder-decoder or UniLM.", flag_values=fv)
    flags.DEFINE_multi_string("prompt", [], "Text for a causal LM to continue; repeat for several.", flag_values=fv)
    flags.DEFINE_multi_string("source", [], "Text for an encoder-decoder or UniLM to transduce; repeat for several.",
                              flag_values=fv)
    flags.DEFINE_integer("max_new_tokens", 50, "Tokens to generate after each prompt.", flag_values=fv)
    flags.DEFINE_float("temperature", 0.0, "Softmax temperature; 0 is greedy.", flag_values=fv)
    flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens; 0: all.", flag_values=fv)
    flags.DEFINE_float("top_p", 1.0, "Sample within the nucleus of this probability; 1: all.", flag_values=fv)
    flags.DEFINE_integer("num_samples", 1, "Continuations per prompt.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the sampling; the same seed gives the same text.", flag_values=fv)
    flags.DEFINE_integer("num_beams", 1, "Beam search with this many beams; 1: greedy or sampled.", flag_values=fv)
    flags.DEFINE_float("length_penalty", 1.0, "Beam scores are sum log p / length**length_penalty.", flag_values=fv)
    return fv


def _main(fv: flags.FlagValues) -> None:
    if not fv.checkpoint or bool(fv.prompt) == bool(fv.source):
        raise UserError("--checkpoint and one of --prompt (causal LM) or --source (encoder-decoder, UniLM) are "
                        "required, e.g. --checkpoint runs/gpt_tiny --prompt 'Return the'")
    if fv.num_samples < 1:
        raise UserError(f"--num_samples={fv.num_samples}; ask for at least 1")
    from bertology.generation import generate_text

    prompts = [p for p in fv.prompt or fv.source for _ in range(fv.num_samples)]
    texts = generate_text(fv.checkpoint, prompts, sources=bool(fv.source), max_new_tokens=fv.max_new_tokens,
                          temperature=fv.temperature, top_k=fv.top_k, top_p=fv.top_p, seed=fv.seed,
                          num_beams=fv.num_beams, length_penalty=fv.length_penalty)
    for prompt, text in zip(prompts, texts):
        print(f">>> {prompt}\n{text}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status."""
    return cli.run_flags("bertology.generate", __doc__, _flags(), _main, argv)


if __name__ == "__main__":
    sys.exit(main())
