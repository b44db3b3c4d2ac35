"""Distil all-MiniLM-L6-v2 into a 3-layer student (configs/minilm_student.py) and report the
student/teacher sentence-embedding cosine on held-out text, parameters and CPU speed.

    python -m benchmarks.minilm_distil [--steps 100] [--batch_size 32] [--workdir runs/minilm_distil]

Held-out text: the sentences of the corpus documents the pretraining stream holds out
(`data.corpus.EVAL_EVERY`) that no training document also contains, so the student never
trained on any of them. Embeddings are
`bertology.features.extract`'s mean-pooled last layer (sentence-transformers' pooling for this
model; the teacher's equals its `encode` within 1e-4, tests/test_minilm_distil.py). The cosine
is reported for the student as initialised (teacher layers [0, 3, 5] for 3, no training) and after
`--steps` steps. Speed: the jitted encoder of each over the same batch of held-out sentences
(padded to the batch's longest), teacher and student calls alternating in one process so both
see the same machine load; sentences/s from the median wall time, and CPU seconds per call
(all threads), which other processes on a shared machine inflate less.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from bertology import features, models
from bertology.data import corpus as corpus_lib
from bertology.data.embedded import embedded_corpus_path
from bertology.data.tokenizers import for_data
from bertology.interop.hf import write_run
from bertology.families.distilbert.model import teacher_layers
from bertology.models.transformer import Encoder
from bertology.sweep import load_config
from bertology.tasks.encode import encode_pair, stack
from bertology.train.checkpoint import check_shapes, load_params
from bertology.train.loop import train
from bertology.train.step import param_init

REPO = pathlib.Path(__file__).resolve().parents[1]


def held_out_sentences(checkpoint: str | pathlib.Path, corpus: str | pathlib.Path | None = None) -> list[str]:
    """The sentences of the documents a pretraining run on `corpus` (default: the embedded one)
    holds out, less any that also occur in a training document (the stdlib repeats some
    docstring sentences across modules), each once. `checkpoint`'s tokenizer names the cached shards."""
    _, config = load_params(checkpoint)
    corpus = corpus or embedded_corpus_path()
    tokenizer = for_data(config["data"])
    held = corpus_lib.load_documents(corpus, tokenizer, config["data"]["vocab"], progress=False)["validation"]
    documents = list(corpus_lib.read_documents(corpus_lib.corpus_files(corpus)))
    held_indices = {held.corpus_index(i) for i in range(len(held))}
    trained = {s for i, d in enumerate(documents) if i not in held_indices for s in d}
    return list(dict.fromkeys(s for i in sorted(held_indices) for s in documents[i] if s not in trained))


def initial_student(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> pathlib.Path:
    """A run directory holding the student of `config` exactly as distillation starts it (the
    family's `from_teacher` on the teacher's parameters), so it can be evaluated like a trained one."""
    teacher, teacher_config = load_params(config.teacher_checkpoint)
    block = ml_collections.ConfigDict(config.model.to_dict())
    block.vocab_size = teacher_config["model"]["vocab_size"]
    model = models.build(block)
    example = {"input_ids": np.zeros((1, 8), np.int32), "input_mask": np.ones((1, 8), np.int32),
               "masked_positions": np.zeros((1, 1), np.int32)}  # the family's MLM head reads it at init
    fresh = nn.meta.unbox(jax.eval_shape(param_init(model, example), jax.random.key(0)))  # shapes only
    params = models.family(block.family).from_teacher(teacher, fresh)
    check_shapes(params, fresh, config.teacher_checkpoint)
    vocab = pathlib.Path(teacher_config["data"]["vocab"])
    write_run(workdir, block.to_dict(), params, [vocab])
    return pathlib.Path(workdir)


def embedding_cosines(teacher: str | pathlib.Path, students: Sequence[str | pathlib.Path],
                      texts: Sequence[str]) -> list[np.ndarray]:
    """Per student run, per text, the cosine between its mean-pooled sentence embedding and the teacher's."""
    t = features.extract(teacher, texts, max_seq_length=128)["sentence"]
    t = t / np.linalg.norm(t, axis=1, keepdims=True)
    out = []
    for student in students:
        s = features.extract(student, texts, max_seq_length=128)["sentence"]
        out.append((t * s).sum(1) / np.linalg.norm(s, axis=1))
    return out


def encoder_parameters(checkpoint: str | pathlib.Path) -> tuple[int, int]:
    """(parameters, of which outside the embedding layer) of a run's encoder as sentence
    embedding uses it: the trunk without the pooler, which mean pooling never reads."""
    params, config = load_params(checkpoint)
    trunk = {k: v for k, v in models.pretrained_encoder(params, config["model"])[1].items() if k != "pooler"}
    total = sum(x.size for x in jax.tree.leaves(trunk))
    return total, total - sum(x.size for x in jax.tree.leaves(trunk["embeddings"]))


def encoder_rates(checkpoints: Sequence[str | pathlib.Path], texts: Sequence[str],
                  repeats: int = 10) -> list[tuple[float, float]]:
    """Per checkpoint, (sentences/s from the median wall time, CPU seconds per call) of its
    jitted encoder on `texts` as one batch; the runs' calls alternate (see the module docstring)."""
    runs = []
    for checkpoint in checkpoints:
        params, config = load_params(checkpoint)
        cfg, trunk = models.pretrained_encoder(params, config["model"])
        tokenizer = for_data(config["data"])
        arrays = stack([encode_pair(tokenizer, t, "", 128) for t in texts])
        length = int(arrays["input_mask"].sum(1).max())
        batch = {k: v[:, :length] for k, v in arrays.items()}
        run = jax.jit(lambda p, b, cfg=cfg: Encoder(cfg).apply({"params": p}, b)["sequence"])
        jax.block_until_ready(run(trunk, batch))
        runs.append((run, trunk, batch))
    wall: list[list[float]] = [[] for _ in runs]
    cpu: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for i, (run, trunk, batch) in enumerate(runs):
            w, c = time.perf_counter(), time.process_time()
            jax.block_until_ready(run(trunk, batch))
            wall[i].append(time.perf_counter() - w)
            cpu[i].append(time.process_time() - c)
    return [(len(texts) / statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu)]


def student_config(steps: int, batch_size: int, layers: int = 3) -> ml_collections.ConfigDict:
    """configs/minilm_student.py for a run of `steps` steps (warm-up 10% of them, one device,
    one checkpoint at the end, no evaluation during training: the cosine is measured after)."""
    c = load_config(REPO / "configs" / "minilm_student.py", str(layers))
    c.total_steps, c.batch_size = steps, batch_size
    c.optimizer.warmup_steps = max(1, steps // 10)
    c.mesh.shape = (1, 1)
    c.eval_every, c.checkpoint_every, c.log_every = 0, steps, max(1, steps // 10)
    return c


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--layers", type=int, default=3, help="student depth")
    p.add_argument("--workdir", default="runs/minilm_distil", help="a new directory (a finished run is resumed as is)")
    p.add_argument("--speed_batch", type=int, default=64, help="held-out sentences per timed batch")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    config = student_config(args.steps, args.batch_size, args.layers)
    workdir = pathlib.Path(args.workdir)
    start = time.perf_counter()
    train(config, workdir / "student")
    train_s = time.perf_counter() - start
    initial = workdir / "initial"
    if not (initial / "config.json").exists():
        initial_student(config, initial)
    teacher = config.teacher_checkpoint
    texts = held_out_sentences(teacher)
    before, after = embedding_cosines(teacher, [initial, workdir / "student"], texts)
    (t_rate, t_cpu), (s_rate, s_cpu) = encoder_rates([teacher, workdir / "student"], texts[:args.speed_batch],
                                                     args.repeats)
    (t_params, t_body), (s_params, s_body) = encoder_parameters(teacher), encoder_parameters(workdir / "student")
    print(f"\n{len(texts)} held-out sentences; {args.steps} steps of batch {args.batch_size}x"
          f"{config.data.max_seq_length} in {train_s:.0f} s; speed over {min(len(texts), args.speed_batch)} "
          f"sentences, median of {args.repeats}")
    depth = load_params(teacher)[1]["model"]["num_layers"]
    print("| model | layers | encoder params (non-embedding) | cosine to teacher, mean / min | sentences/s "
          "| CPU s per batch |")
    print("|---|---|---|---|---|---|")
    student = f"{args.layers} | {s_params / 1e6:.2f}M ({s_body / 1e6:.2f}M)"
    print(f"| all-MiniLM-L6-v2 (teacher) | {depth} | {t_params / 1e6:.2f}M ({t_body / 1e6:.2f}M) | 1 "
          f"| {t_rate:,.0f} | {t_cpu:.3f} |")
    print(f"| student, initialised (teacher layers {teacher_layers(depth, args.layers)}) | {student} "
          f"| {before.mean():.4f} / {before.min():.4f} | | |")
    print(f"| student, {args.steps} steps | {student} | {after.mean():.4f} / {after.min():.4f} "
          f"| {s_rate:,.0f} | {s_cpu:.3f} |")
    print(f"student/teacher: {s_params / t_params:.1%} of the parameters ({s_body / t_body:.1%} outside the "
          f"embeddings), {s_rate / t_rate:.2f}x the sentences/s (wall), {t_cpu / s_cpu:.2f}x less CPU time")
    return {"cosine_before": float(before.mean()), "cosine_after": float(after.mean()), "teacher_rate": t_rate,
            "student_rate": s_rate, "teacher_params": t_params, "student_params": s_params}


if __name__ == "__main__":
    main()
