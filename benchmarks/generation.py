"""Generation throughput, ours against Hugging Face Flax, in one process: GPT-2 greedy, or T5 /
BART beam search.

    python -m benchmarks.generation [--preset gpt2] [--batch_sizes 1,8] [--prompt_len 16] [--new_tokens 64]
    python -m benchmarks.generation --recipe t5 --preset small --num_beams 4 --prompt_len 128 --new_tokens 32
    python -m benchmarks.generation --recipe bart --preset base --num_beams 4 --prompt_len 128 --new_tokens 32

Encoder-decoders (`--recipe t5|bart`): our family from configs/<recipe>.py against
`FlaxT5ForConditionalGeneration` / `FlaxBartForConditionalGeneration` random-initialised from the
config an export would write (`benchmarks.reference.hf_seq2seq_model`); the prompts are the
sources (no padding), both decode `new_tokens` tokens with `num_beams` beams, length penalty 1,
from the family's decoder start, and an EOS id outside the vocabulary so that no hypothesis ends
early and both run every step. Tokens/s counts batch x new_tokens (the returned best hypotheses).

Both get random parameters of the same shape (`configs/gpt.py`'s preset, and for HF the
matching GPT2Config), the same prompts (batch x prompt_len random ids, no padding), and produce
`new_tokens` greedy tokens with a KV cache. HF's `generate`
is jitted whole (with `params` as an argument, as its docs advise for speed); ours is
`bertology.generation.generate`. Each is warmed up once (compilation), then the two take turns
for `--repeats` timed calls; the medians of wall time and of this process's CPU time give new
tokens/s and the ratios. Appends a JSON line to --out/generation.jsonl and a markdown row to
--out/generation.md per batch size.

On XLA:CPU the ratio turns on the weight layout (profiled with jax.profiler): at batch 1 a dot
is XLA's own matrix-vector kernel, which takes our [in, out] kernels as they are but copies a
transpose of every [out, in] kernel of HF's GPT-2 (its Conv1D layout) at every step; from batch 2
dots go to YNNPACK, which runs x @ W faster with W stored [out, in], and HF also projects
queries, keys and values in one dot where we run three. From batch 2 nearly all of a step
(GPT-2 small at batch 8: about 90% of its op time, jax.profiler) is the weight products, the
same kernels over the same bytes on both sides, so the ratio is bounded by what each side does
besides them: per-step copies (our cache kept [batch, heads, slots, head_dim] so that none is
copied into the attention products' layout; beam search gathers only the self-attention cache).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from benchmarks import report, train_step, train_step_seq2seq
from bertology import models
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.generation import generate
from bertology.models.transformer import TransformerConfig

REPO = pathlib.Path(__file__).resolve().parents[1]


def gpt_config(preset: str, vocab_size: int | None) -> Any:
    """configs/gpt.py's config for `preset`; `vocab_size` None keeps the preset's (tiny: its tokenizer's)."""
    sys.path.insert(0, str(REPO / "configs"))
    import gpt

    c = gpt.get_config(preset)
    c.model.vocab_size = vocab_size or c.model.vocab_size or load_tokenizer(c.data.vocab).vocab_size
    return c


def ours(cfg_block: Any, prompt: np.ndarray, new_tokens: int, **options: Any) -> Callable[[], np.ndarray]:
    """Our `generate` on random parameters; `options` (decoder_start_id, num_beams, eos_id) as it takes them."""
    model = models.build(cfg_block)
    mask = np.ones_like(prompt)
    example = {"input_ids": prompt[:1], "input_mask": mask[:1], "decoder_input_ids": prompt[:1, :1],
               "decoder_input_mask": mask[:1, :1]}
    params = jax.jit(lambda k: nn.meta.unbox(model.init(k, example)["params"]))(jax.random.key(0))
    return lambda: generate(model, params, prompt, mask, max_new_tokens=new_tokens, **options)


def hf_gpt2(cfg: TransformerConfig) -> tuple[Any, Any]:
    """FlaxGPT2LMHeadModel of `cfg`'s shape (tanh GELU, pre-LN: what GPT-2 is) and random parameters."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
                        n_layer=cfg.num_layers, n_head=cfg.num_heads, n_inner=cfg.intermediate_size,
                        activation_function="gelu_new", layer_norm_epsilon=cfg.layer_norm_eps,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0,
                        bos_token_id=cfg.vocab_size, eos_token_id=cfg.vocab_size)  # an id never produced: no early stop
    model = FlaxGPT2LMHeadModel(config, dtype=cfg.compute_dtype, _do_init=False)
    return model, jax.jit(model.init_weights, static_argnums=1)(jax.random.PRNGKey(0), (1, 1))  # eager init is slow


def theirs(cfg: TransformerConfig, prompt: np.ndarray, new_tokens: int) -> Callable[[], np.ndarray]:
    model, params = hf_gpt2(cfg)
    run = jax.jit(lambda params, ids, mask: model.generate(ids, attention_mask=mask, params=params, do_sample=False,
                                                         max_new_tokens=new_tokens).sequences)
    ids, mask = jax.device_put(prompt), jax.device_put(np.ones_like(prompt))
    return lambda: np.asarray(run(params, ids, mask))[:, prompt.shape[1]:]


def theirs_seq2seq(block: dict[str, Any], source: np.ndarray, new_tokens: int, start_id: int,
                   num_beams: int) -> Callable[[], np.ndarray]:
    """transformers' Flax `generate` (jitted whole, `params` an argument) on the reference model."""
    from benchmarks.reference import hf_seq2seq_model

    model, params = hf_seq2seq_model(block)
    never = block["vocab_size"]  # an EOS id no step produces: every hypothesis runs max_new_tokens
    run = jax.jit(lambda params, ids, mask: model.generate(
        ids, attention_mask=mask, params=params, do_sample=False, num_beams=num_beams, max_new_tokens=new_tokens,
        decoder_start_token_id=start_id, eos_token_id=never, pad_token_id=0, length_penalty=1.0,
        early_stopping=False, no_repeat_ngram_size=0, forced_bos_token_id=None, forced_eos_token_id=None,
        min_length=0).sequences)
    ids, mask = jax.device_put(source), jax.device_put(np.ones_like(source))
    return lambda: np.asarray(run(params, ids, mask))[:, 1:]


def timed(runs: list[Callable[[], np.ndarray]], repeats: int) -> list[dict[str, float]]:
    """Median wall and process-CPU seconds per call of each run, after one warm-up call each;
    the runs take turns so a load change on a shared machine hits them alike."""
    for run in runs:
        run()
    times: list[dict[str, list[float]]] = [{"wall": [], "cpu": []} for _ in runs]
    for _ in range(repeats):
        for r, run in enumerate(runs):
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            times[r]["wall"].append(time.perf_counter() - wall)
            times[r]["cpu"].append(time.process_time() - cpu)
    return [{k: float(np.median(v)) for k, v in t.items()} for t in times]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="gpt", choices=("gpt", "t5", "bart"))
    p.add_argument("--preset", default="gpt2", help="a preset of configs/<recipe>.py: gpt tiny, gpt2, gpt2_medium; "
                   "t5 small; bart base")
    p.add_argument("--vocab_size", type=int, default=None, help="default: the preset's (gpt tiny: its 8k tokenizer's; "
                   "t5, bart: the released checkpoints')")
    p.add_argument("--num_beams", type=int, default=1, help="beam search width (t5, bart); 1: greedy")
    p.add_argument("--batch_sizes", default="1,8")
    p.add_argument("--prompt_len", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no_reference", action="store_true", help="skip Hugging Face")
    p.add_argument("--out", default="runs/benchmarks")
    args = p.parse_args(argv)

    if args.recipe == "gpt":
        if args.num_beams != 1:
            raise UserError("--num_beams is for --recipe t5 or bart; the GPT-2 benchmark decodes greedily")
        config = gpt_config(args.preset, args.vocab_size)
    else:
        vocab = args.vocab_size or train_step_seq2seq.VOCAB[args.recipe]
        config = train_step.recipe_config(args.recipe, args.preset, vocab, "float32", "none")
    cfg = models.encoder_config(config.model)
    start = train_step_seq2seq.START.get(args.recipe)
    options = {} if start is None else dict(decoder_start_id=start, num_beams=args.num_beams)
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        prompt = np.random.default_rng(0).integers(1, cfg.vocab_size, (batch, args.prompt_len)).astype(np.int32)
        runs = [ours(config.model, prompt, args.new_tokens, **options)]
        if not args.no_reference:
            runs.append(theirs(cfg, prompt, args.new_tokens) if start is None else
                        theirs_seq2seq(dict(config.model), prompt, args.new_tokens, start, args.num_beams))
        seconds = timed(runs, args.repeats)
        tokens = batch * args.new_tokens
        preset = args.preset if start is None else f"{args.recipe}:{args.preset}"
        row: dict[str, Any] = dict(preset=preset, vocab_size=cfg.vocab_size, batch_size=batch, num_beams=args.num_beams,
                                   prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                   device=jax.devices()[0].device_kind, tokens_per_s=tokens / seconds[0]["wall"])
        if not args.no_reference:
            row["hf_tokens_per_s"] = tokens / seconds[1]["wall"]
            row["ratio"] = row["tokens_per_s"] / row["hf_tokens_per_s"]
            row["cpu_ratio"] = seconds[1]["cpu"] / seconds[0]["cpu"]
        report.append([row], pathlib.Path(args.out), "generation", COLUMNS, FORMATS)
        rows.append(row)
    return rows


COLUMNS = ["preset", "vocab_size", "batch_size", "num_beams", "prompt_len", "new_tokens", "device", "tokens_per_s",
           "hf_tokens_per_s", "ratio", "cpu_ratio"]
FORMATS = {"tokens_per_s": "{:,.1f}", "hf_tokens_per_s": "{:,.1f}", "ratio": "{:.2f}x", "cpu_ratio": "{:.2f}x"}


if __name__ == "__main__":
    main()
