"""Continue prompts with a causal LM run (configs/gpt.py), greedy or sampled.

    python -m bertology.generate --checkpoint runs/gpt_tiny --prompt "Return the" [--prompt ...] \\
        [--max_new_tokens 50 --temperature 0 --top_k 0 --top_p 1 --num_samples 1 --seed 0]

Prints, for each prompt and sample, a `>>> prompt` line and then the continuation (up to the
tokenizer's end-of-text token). All prompts and samples run as one batch; samples of one prompt
differ because every row draws its own tokens. Bad input ends with one line and exit status 2.
"""

from __future__ import annotations

import sys

from absl import flags

from bertology.errors import UserError


def _flags() -> flags.FlagValues:
    fv = flags.FlagValues()
    flags.DEFINE_string("checkpoint", None, "A causal-LM run directory (config.json + checkpoints/).", flag_values=fv)
    flags.DEFINE_multi_string("prompt", [], "Text to continue; repeat the flag for several prompts.", flag_values=fv)
    flags.DEFINE_integer("max_new_tokens", 50, "Tokens to generate after each prompt.", flag_values=fv)
    flags.DEFINE_float("temperature", 0.0, "Softmax temperature; 0 is greedy.", flag_values=fv)
    flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens; 0: all.", flag_values=fv)
    flags.DEFINE_float("top_p", 1.0, "Sample within the nucleus of this probability; 1: all.", flag_values=fv)
    flags.DEFINE_integer("num_samples", 1, "Continuations per prompt.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the sampling; the same seed gives the same text.", flag_values=fv)
    return fv


def main(argv: list[str]) -> int:
    fv = _flags()
    try:
        fv(argv)
        if not fv.checkpoint or not fv.prompt:
            raise UserError("--checkpoint and --prompt are required, e.g. --checkpoint runs/gpt_tiny --prompt 'Return the'")
        if fv.num_samples < 1:
            raise UserError(f"--num_samples={fv.num_samples}; ask for at least 1")
        from bertology.generation import generate_text

        prompts = [p for p in fv.prompt for _ in range(fv.num_samples)]
        texts = generate_text(fv.checkpoint, prompts, max_new_tokens=fv.max_new_tokens, temperature=fv.temperature,
                              top_k=fv.top_k, top_p=fv.top_p, seed=fv.seed)
    except (UserError, flags.Error) as e:
        print(f"bertology.generate: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    for prompt, text in zip(prompts, texts):
        print(f">>> {prompt}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
