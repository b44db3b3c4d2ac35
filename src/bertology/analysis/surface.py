"""The training loss around a fine-tuning run's solution: the loss surfaces of Hao et al. (2019),
"Visualizing and Understanding the Effectiveness of BERT" (seed 002's "Why Fine-tune?").

Both are read off the fine-tuning objective over the run's own training rows (its task, data and
preprocessing, rebuilt from the run's config.json), without dropout:
- 1-D: the loss along the straight line from where fine-tuning started (the pretrained trunk
  with the head the run's seed initialised, exactly what `finetune` started from) to where it
  ended, θ(α) = θ₀ + α·(θ₁ − θ₀); α = 0 is the start, 1 the end, and the plot runs a little
  beyond both;
- 2-D: the loss on the plane θ₁ + x·d₁ + y·d₂ through the end point, spanned by two random
  directions normalised filter by filter as Li et al. (2018) do (each output unit's column of a
  weight matrix scaled to that column's norm in θ₁; biases and norms held still), so that the
  plot's scale means the same in every layer. A wide basin around θ₁ is what Hao et al. find
  for pretrained starts and not for random ones.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from bertology.analysis.plots import pyplot, save
from bertology.errors import UserError


def endpoints(run: str | pathlib.Path, rows: int | None = None) -> tuple[Any, Any, Any, Any, list[dict[str, np.ndarray]]]:
    """(start params, end params, the task model, its objective, the training rows in fixed
    batches: the first `rows` of them, all when None) of a fine-tuning run directory."""
    import flax.linen as nn
    import jax
    import ml_collections

    from bertology import tasks
    from bertology.train.checkpoint import load_params, read_json
    from bertology.train.finetune import encoder_job
    from bertology.train.step import param_init

    config = ml_collections.ConfigDict(read_json(pathlib.Path(run) / "config.json",
                                                 "pass the --workdir of a bertology fine-tuning run"))
    if "task" not in config:
        raise UserError(f"{run} is a pretraining run; loss surfaces are of fine-tuning runs (bertology.finetune)")
    if config.get("teacher_checkpoint"):
        raise UserError(f"{run} learned a teacher's predictions (teacher_checkpoint); its loss needs the teacher, "
                        "so loss surfaces read runs trained on the labels")
    task = tasks.get(config.task, config.data)
    if task.kind == "seq2seq":
        raise UserError(f"task {task.name} fine-tunes a whole sequence-to-sequence model; loss surfaces read "
                        "encoder tasks (classification, regression, token, qa, choice)")
    job = encoder_job(config, task)
    fresh = nn.meta.unbox(jax.jit(param_init(job.model, job.example))(jax.random.key(config.seed)))
    start = fresh if job.start_params is None else job.start_params(fresh)
    end, _ = load_params(run)
    arrays = {k: v[:rows] for k, v in job.rows.arrays.items()}
    size = max(config.eval_batch_size, 128)  # forward passes only: few large batches, not many dispatches
    batches = [{k: v[i:i + size] for k, v in arrays.items()} for i in range(0, len(arrays["input_ids"]), size)]
    return start, end, job.model, job.objective, batches


def loss_function(model: Any, objective: Any, batches: list[dict[str, np.ndarray]]) -> Any:
    """params -> the objective's loss over every batch: each mean's sums added over the batches
    and divided once, as held-out evaluation sums them (`Run.evaluator`)."""
    import jax

    from bertology.objectives import summed

    terms = jax.jit(lambda p, b: objective.terms(p, b, None, model))

    def loss(params: Any) -> float:
        return float(objective.metrics(summed([jax.device_get(terms(params, b)) for b in batches]))["loss"])

    return loss


def filter_normalised(end: Any, seed: int) -> Any:
    """A random direction shaped like `end`: Gaussian, each column (output unit) of every matrix
    scaled to the norm of that column in `end`; vectors (biases, norms) zero."""
    import jax

    rng = np.random.default_rng(seed)

    def direction(x: Any) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if x.ndim < 2:
            return np.zeros_like(x)
        d = rng.standard_normal(x.shape)
        axes = tuple(range(x.ndim - 1))  # a column: every input axis of one output unit
        return d * np.linalg.norm(x, axis=axes, keepdims=True) / np.maximum(np.linalg.norm(d, axis=axes, keepdims=True), 1e-12)

    return jax.tree.map(direction, end)


def surfaces(run: str | pathlib.Path, *, points: int = 20, grid: int = 5, span: float = 1.0, rows: int | None = None,
             seed: int = 0) -> dict[str, Any]:
    """{'alphas', 'line' (the 1-D losses), 'coordinates', 'plane' [2·grid+1][2·grid+1] (rows: d₂,
    columns: d₁), 'training_rows'}. The line has `points` steps from start to end and a quarter
    of that beyond each; the plane `grid` steps from its centre to each edge, `span` away; the
    loss is over the first `rows` training rows (all when None)."""
    import jax
    from tqdm import tqdm

    if points < 1 or grid < 1 or span <= 0:
        raise UserError(f"points={points}, grid={grid}, span={span}: need at least 1 step each way and a span > 0")
    start, end, model, objective, batches = endpoints(run, rows)
    evaluate = loss_function(model, objective, batches)
    beyond = -(-points // 4)
    alphas = np.arange(-beyond, points + beyond + 1) / points  # 0 and 1 exactly among them
    coordinates = np.arange(-grid, grid + 1) / grid * span  # 0 exactly at the centre
    progress = tqdm(total=len(alphas) + len(coordinates) ** 2, desc="loss surface", unit="eval", mininterval=10)

    def loss(params: Any) -> float:
        progress.update()
        return evaluate(params)

    # (1 - α)·θ₀ + α·θ₁: exactly θ₀ at 0 and θ₁ at 1 (θ₀ + α(θ₁ − θ₀) misses θ₁ in float32's last bit)
    line = [loss(jax.tree.map(lambda a, b: (1 - float(t)) * a + float(t) * b, start, end)) for t in alphas]
    d1, d2 = filter_normalised(end, seed), filter_normalised(end, seed + 1)
    plane = [[loss(jax.tree.map(lambda e, u, v: (e + x * u + y * v).astype(np.asarray(e).dtype), end, d1, d2))
              for x in coordinates.tolist()] for y in coordinates.tolist()]
    progress.close()
    return {"alphas": alphas.tolist(), "line": line, "coordinates": coordinates.tolist(), "plane": plane,
            "training_rows": int(sum(len(b["input_ids"]) for b in batches))}


def plot(result: dict[str, Any], title: str, path_1d: pathlib.Path, path_2d: pathlib.Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(result["alphas"], result["line"], marker="o", markersize=3)
    for at, name in ((0, "start"), (1, "end")):
        ax.axvline(at, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(name, (at, max(result["line"])), ha="center", va="bottom", fontsize="small")
    ax.set_xlabel("α: θ₀ + α(θ₁ − θ₀)")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize="medium")
    save(fig, path_1d)
    fig, ax = plt.subplots(figsize=(5, 4.2))
    c = result["coordinates"]
    contours = ax.contourf(c, c, np.array(result["plane"]), levels=20, cmap="viridis")
    ax.plot(0, 0, "r+", markersize=10)
    fig.colorbar(contours, ax=ax, label="training loss")
    ax.set_xlabel("direction 1 (filter-normalised)")
    ax.set_ylabel("direction 2")
    ax.set_title(title, fontsize="medium")
    save(fig, path_2d)
