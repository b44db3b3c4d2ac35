"""Generation: the cached loop against full recomputation and against Hugging Face's GPT-2,
sampling against the distributions it claims (numpy nucleus, chi-square on softmax draws),
end of text, the GPT configs' parameter counts, and the CLI on a run directory."""

import json
import pathlib
import subprocess
import sys

import flax.linen as nn
import helpers
import jax
import ml_collections
import numpy as np
import pytest
from helpers import REPO, write_run
from scipy.special import softmax
from scipy.stats import chisquare

from bertology import generate as cli
from bertology import models
from bertology.data.tokenizers import for_data, load_tokenizer
from bertology.errors import UserError
from bertology.generation import filter_logits, generate, generate_text, left_pad
from bertology.families.gpt import model as gpt
from bertology.models.transformer import TransformerConfig

V = 64


def small(norm: str = "pre", **kw) -> TransformerConfig:
    """A GPT-2-style config; a wide init spreads the logits so argmaxes are far from ties."""
    base = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=40,
                type_vocab_size=0, embedding_norm=False, pooler=False, activation="gelu_tanh", layer_norm_eps=1e-5,
                dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.3, norm=norm)
    return TransformerConfig(**{**base, **kw})


def model_and_params(cfg: TransformerConfig, seed: int = 0):
    model = gpt.Model(cfg)
    example = {"input_ids": np.ones((1, 4), np.int32), "input_mask": np.ones((1, 4), np.int32)}
    return model, nn.meta.unbox(model.init(jax.random.key(seed), example)["params"])


def prompts(rng: np.random.Generator):
    """Lengths 7, 4 (right-padded), 5 (left-padded), 1 (right-padded) in one [4, 7] batch."""
    ids = rng.integers(1, V, (4, 7)).astype(np.int32)
    mask = np.zeros((4, 7), np.int32)
    mask[0], mask[1, :4], mask[2, 2:], mask[3, :1] = 1, 1, 1, 1
    return ids, mask


def forward(model, params):
    """Logits [batch, length, vocab] by a full pass (no cache), positions from the mask; jitted, so
    the reference costs one compilation per shape."""
    @jax.jit
    def run(ids, mask):
        positions = jax.numpy.maximum(jax.numpy.cumsum(mask, 1) - 1, 0)
        return model.apply({"params": params}, {"input_ids": ids, "input_mask": mask, "positions": positions})["logits"]
    return lambda ids, mask: np.asarray(run(ids, mask), np.float64)


def last_logits(model, params, ids, mask) -> np.ndarray:
    """Next-token logits after each (left-padded) row."""
    return forward(model, params)(*left_pad(ids, mask))[:, -1]


def greedy_by_recomputation(model, params, ids, mask, steps: int) -> np.ndarray:
    """Argmax of a full pass over the prompt and the tokens so far, token by token. The rows are
    right-padded to their final length, which a causal model's earlier positions never see."""
    ids, mask = left_pad(ids, mask)
    width = ids.shape[1]
    ids, mask = (np.pad(a, ((0, 0), (0, steps))) for a in (ids, mask))
    run = forward(model, params)
    for t in range(steps):
        logits = run(ids, mask)[:, width + t - 1]
        top2 = np.sort(logits, axis=1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 1e-3  # no near-tie: float noise cannot flip the reference
        ids[:, width + t], mask[:, width + t] = logits.argmax(1), 1
    return ids[:, width:]


# ---------------------------------------------------------------- greedy


def test_left_pad_moves_real_tokens_right_in_order():
    ids = np.array([[5, 6, 7, 0], [0, 8, 9, 0], [0, 0, 3, 4]])
    mask = np.array([[1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    got_ids, got_mask = left_pad(ids, mask)
    np.testing.assert_array_equal(got_ids, [[5, 6, 7], [0, 8, 9], [0, 3, 4]])
    np.testing.assert_array_equal(got_mask, [[1, 1, 1], [0, 1, 1], [0, 1, 1]])


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_greedy_with_cache_equals_recomputing_the_prefix(norm):
    model, params = model_and_params(small(norm))
    ids, mask = prompts(np.random.default_rng(1))
    got = generate(model, params, ids, mask, max_new_tokens=8)
    np.testing.assert_array_equal(got, greedy_by_recomputation(model, params, ids, mask, 8))


def test_greedy_equals_hugging_face_gpt2_on_the_same_weights():
    """HF's GPT2LMHeadModel (the GPT-2 reference) with its weights copied into ours: the same
    logits, and `generate` gives HF's greedy tokens."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(3)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=4, n_inner=64, initializer_range=0.3,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, bos_token_id=V, eos_token_id=V)).eval()
    p = {k: v.detach().numpy() for k, v in hf.state_dict().items()}

    def norm(name):
        return {"scale": p[f"{name}.weight"], "bias": p[f"{name}.bias"]}

    d, heads = 32, 4
    ours = {"embeddings": {"token": {"embedding": p["transformer.wte.weight"]},
                           "position": {"embedding": p["transformer.wpe.weight"]}},
            "final_norm": norm("transformer.ln_f")}
    for i in range(2):
        h = f"transformer.h.{i}"
        qkv, qkv_bias = p[f"{h}.attn.c_attn.weight"], p[f"{h}.attn.c_attn.bias"]  # Conv1D weights are [in, out]
        proj = {n: {"kernel": qkv[:, j * d:(j + 1) * d].reshape(d, heads, -1),
                    "bias": qkv_bias[j * d:(j + 1) * d].reshape(heads, -1)} for j, n in enumerate(("query", "key", "value"))}
        ours[f"attention_{i}"] = {"norm": norm(f"{h}.ln_1"), **proj, "output": {
            "kernel": p[f"{h}.attn.c_proj.weight"].reshape(heads, -1, d), "bias": p[f"{h}.attn.c_proj.bias"]}}
        ours[f"ffn_{i}"] = {"norm": norm(f"{h}.ln_2"),
                            "intermediate": {"kernel": p[f"{h}.mlp.c_fc.weight"], "bias": p[f"{h}.mlp.c_fc.bias"]},
                            "output": {"kernel": p[f"{h}.mlp.c_proj.weight"], "bias": p[f"{h}.mlp.c_proj.bias"]}}
    model, params = gpt.Model(small()), {"decoder": ours}
    ids = np.random.default_rng(4).integers(1, V, (3, 6)).astype(np.int32)
    mask = np.ones_like(ids)
    with torch.no_grad():
        hf_logits = hf(torch.tensor(ids).long()).logits.numpy()
        theirs = hf.generate(torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long(), do_sample=False,
                             max_new_tokens=10).numpy()[:, 6:]
    np.testing.assert_allclose(last_logits(model, params, ids, mask), hf_logits[:, -1], atol=2e-5)
    np.testing.assert_array_equal(generate(model, params, ids, mask, max_new_tokens=10), theirs)


# ---------------------------------------------------------------- sampling


def test_top_k_1_equals_greedy():
    model, params = model_and_params(small())
    ids, mask = prompts(np.random.default_rng(2))
    greedy = generate(model, params, ids, mask, max_new_tokens=6)
    np.testing.assert_array_equal(generate(model, params, ids, mask, max_new_tokens=6, temperature=1.5, top_k=1, seed=7),
                                  greedy)


def numpy_kept(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The kept tokens per the definitions: the k largest; then, by probability renormalised over
    those, the smallest set of the largest whose total reaches p."""
    kept = np.zeros(logits.shape, bool)
    for r, row in enumerate(logits):
        order = np.argsort(-row)[:top_k or None]
        probs = softmax(row[order].astype(np.float64))
        n = int(np.searchsorted(np.cumsum(probs), top_p)) + 1  # first index where the running total reaches p
        kept[r, order[:n]] = True
    return kept


@pytest.mark.parametrize("top_k", [0, 10])
@pytest.mark.parametrize("top_p", [1e-6, 0.3, 0.6, 0.9, 0.999, 1.0])
def test_filter_logits_keeps_the_top_k_and_the_nucleus(top_k, top_p):
    logits = np.random.default_rng(3).normal(0, 2, (6, 50)).astype(np.float32)
    got = np.asarray(filter_logits(logits, top_k, top_p))
    kept = numpy_kept(logits, top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(got), kept)
    np.testing.assert_array_equal(got[kept], logits[kept])
    if top_p == 1e-6:
        assert (kept.sum(1) == 1).all()  # always at least the most likely token


def test_sampling_is_reproducible_by_seed():
    model, params = model_and_params(small())
    ids, mask = prompts(np.random.default_rng(5))
    draw = lambda seed: generate(model, params, ids, mask, max_new_tokens=10, temperature=1.0, top_p=0.95, seed=seed)  # noqa: E731
    np.testing.assert_array_equal(draw(11), draw(11))
    assert (draw(11) != draw(12)).any()


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 8, 1.0), (1.3, 0, 0.8)])
def test_samples_follow_softmax_over_the_kept_tokens(temperature, top_k, top_p):
    """One step, 4000 rows of the same prompt: the token counts against softmax(logits / T) restricted
    to the kept tokens (a chi-square goodness-of-fit test), and nothing outside them."""
    model, params = model_and_params(small(initializer_range=0.15))
    n = 4000
    ids = np.tile(np.random.default_rng(6).integers(1, V, (1, 5)).astype(np.int32), (n, 1))
    logits = last_logits(model, params, ids[:1], np.ones((1, 5), np.int32))
    kept = numpy_kept(logits / temperature, top_k, top_p)[0]
    expected = np.where(kept, np.exp((logits[0] - logits[0].max()) / temperature), 0.0)
    expected /= expected.sum()
    assert 4 <= kept.sum() < V  # a real restriction with several candidates
    tokens = generate(model, params, ids, np.ones_like(ids), max_new_tokens=1, temperature=temperature, top_k=top_k,
                      top_p=top_p, seed=1)[:, 0]
    counts = np.bincount(tokens, minlength=V)
    assert counts[~kept].sum() == 0
    assert chisquare(counts[kept], n * expected[kept]).pvalue > 1e-3


# ---------------------------------------------------------------- end of text and errors


def test_rows_keep_emitting_eos_after_it():
    model, params = model_and_params(small())
    ids, mask = prompts(np.random.default_rng(1))
    free = generate(model, params, ids, mask, max_new_tokens=8)
    eos = int(free[0, 2])  # row 0 emits it third; other rows may emit it elsewhere or never
    expected = free.copy()
    for row in expected:
        hits = np.flatnonzero(row == eos)
        if hits.size:
            row[hits[0]:] = eos
    np.testing.assert_array_equal(generate(model, params, ids, mask, max_new_tokens=8, eos_id=eos), expected)
    # A batch where every row has ended stops early and is filled with eos.
    np.testing.assert_array_equal(generate(model, params, ids[:1], mask[:1], max_new_tokens=8, eos_id=eos), expected[:1])


def test_bad_input_is_a_user_error():
    model, params = model_and_params(small())
    ids, mask = np.ones((2, 4), np.int32), np.ones((2, 4), np.int32)
    with pytest.raises(UserError, match="prompt 1 has no tokens"):
        generate(model, params, ids, np.array([[1, 1, 0, 0], [0, 0, 0, 0]]), max_new_tokens=2)
    with pytest.raises(UserError, match="exceeds the model's context of 40"):
        generate(model, params, ids, mask, max_new_tokens=37)
    with pytest.raises(UserError, match="0 < top_p <= 1"):
        generate(model, params, ids, mask, max_new_tokens=2, temperature=1.0, top_p=0.0)
    bert = models.build({"family": "bert", "vocab_size": V, "hidden_size": 32, "num_layers": 1, "num_heads": 4,
                         "intermediate_size": 64})
    with pytest.raises(UserError, match="is not a decoder"):
        generate(bert, params, ids, mask, max_new_tokens=2)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("preset, count", [
    ("gpt1", 116_534_784),  # HF openai-gpt: 40478 x 768 tokens, 512 positions, 12 post-LN blocks
    ("gpt2", 124_439_808),  # GPT-2 small with tied output, as HF and nanoGPT count it
    ("gpt2_medium", 354_823_168),
])
def test_presets_have_the_published_parameter_counts(preset, count):
    config = helpers.config("gpt", preset)
    model = models.build(config.model)
    example = {"input_ids": np.ones((1, 4), np.int32), "input_mask": np.ones((1, 4), np.int32)}
    shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), example)["params"]))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == count
    assert ("final_norm" in shapes["decoder"]) == (preset != "gpt1")


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(UserError, match="known presets: tiny, gpt1, gpt2, gpt2_medium"):
        helpers.config("gpt", "gpt3")


# ---------------------------------------------------------------- run directories and the CLI


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """configs/gpt.py:tiny with random parameters and the shipped byte-level BPE."""
    config = helpers.config("gpt", "tiny")
    config.model.vocab_size = load_tokenizer(config.data.vocab).vocab_size
    model = models.build(config.model)
    example = {"input_ids": np.ones((1, 4), np.int32), "input_mask": np.ones((1, 4), np.int32)}
    params = jax.tree.map(np.asarray, nn.meta.unbox(model.init(jax.random.key(0), example)["params"]))
    return write_run(tmp_path_factory.mktemp("gpt_tiny"), config, params), config, params


def test_generate_text_decodes_generate(gpt_run):
    workdir, config, params = gpt_run
    tokenizer = load_tokenizer(config.data.vocab)
    texts = ["def main", "Return the value of"]
    encoded = [tokenizer.encode(t) for t in texts]
    ids = np.array([e + [0] * (4 - len(e)) for e in encoded], np.int32)
    mask = np.array([[1] * len(e) + [0] * (4 - len(e)) for e in encoded], np.int32)
    tokens = generate(models.build(config.model), params, ids, mask, max_new_tokens=12, eos_id=tokenizer.eos_id)
    expected = [tokenizer.decode([t for t in row if t != tokenizer.eos_id]) for row in tokens.tolist()]
    assert all(tokenizer.eos_id not in row for row in tokens.tolist())  # so the end-of-text cut is not in play
    assert generate_text(workdir, texts, max_new_tokens=12) == expected


def test_cli_prints_every_sample(gpt_run):
    workdir = gpt_run[0]
    args = [sys.executable, "-m", "bertology.generate", f"--checkpoint={workdir}", "--prompt=def main",
            "--prompt=Return the", "--num_samples=2", "--temperature=1.0", "--max_new_tokens=8", "--seed=3"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rows = ["def main", "def main", "Return the", "Return the"]
    expected = generate_text(workdir, rows, max_new_tokens=8, temperature=1.0, seed=3)
    assert r.stdout == "".join(f">>> {prompt}\n{text}\n" for prompt, text in zip(rows, expected))
    assert expected[0] != expected[1]  # the two samples of a prompt are separate draws


def random_run(workdir: pathlib.Path, recipe: str):
    """configs/<recipe>.py:tiny with random parameters, its tokenizer, and its model."""
    config = helpers.config(recipe, "tiny")
    tokenizer = for_data(config.data)
    config.model.vocab_size = tokenizer.vocab_size
    model = models.build(config.model)
    example = {"input_ids": np.ones((1, 4), np.int32), "input_mask": np.ones((1, 4), np.int32),
               "decoder_input_ids": np.ones((1, 4), np.int32), "decoder_input_mask": np.ones((1, 4), np.int32),
               "masked_positions": np.zeros((1, 1), np.int32)}
    params = jax.tree.map(np.asarray, nn.meta.unbox(model.init(jax.random.key(1), example)["params"]))
    return write_run(workdir, config, params), tokenizer, model, params


@pytest.mark.parametrize("recipe", ["bart", "unilm"])
def test_cli_transduces_sources_with_encoder_decoders_and_unilm(recipe, tmp_path, capsys):
    workdir, tokenizer, model, params = random_run(tmp_path / recipe, recipe)
    sources = ["Return the sum of a and b.", "Open a file"]
    encoded = [tokenizer.encode(t) for t in sources]
    if recipe == "bart":  # the source closed with EOS as fine-tuning feeds it; the decoder starts from EOS
        rows, eos = [e + [tokenizer.eos_id] for e in encoded], tokenizer.eos_id
        extra = {"decoder_start_id": tokenizer.eos_id}
    else:  # [CLS] source [SEP], predicted at [MASK] positions, the target ending at [SEP]
        rows, eos = [[tokenizer.cls_id, *e, tokenizer.sep_id] for e in encoded], tokenizer.sep_id
        extra = {"mask_id": tokenizer.mask_id}
    width = max(map(len, rows))
    ids = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    mask = (np.arange(width)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
    tokens = generate(model, params, ids, mask, max_new_tokens=6, eos_id=eos, num_beams=3, **extra)
    expected = [tokenizer.decode(row[: row.index(eos)] if eos in row else row) for row in tokens.tolist()]
    args = [f"--checkpoint={workdir}", *(f"--source={t}" for t in sources), "--num_beams=3", "--max_new_tokens=6"]
    assert cli.main(["bertology.generate", *args]) == 0
    assert capsys.readouterr().out == "".join(f">>> {s}\n{t}\n" for s, t in zip(sources, expected))
    assert any(expected)  # a random model's targets are not all empty
    assert cli.main(["bertology.generate", f"--checkpoint={workdir}", "--prompt=a"]) == 2
    assert "maps a source to a target; pass --source, not --prompt" in capsys.readouterr().err


def test_cli_bad_input_is_one_line(gpt_run, tmp_path, capsys):
    bert_run = write_run(tmp_path / "bert", ml_collections.ConfigDict(
        {"model": {"family": "bert", "vocab_size": V}, "data": {"vocab": None}}), {"w": np.zeros(2, np.float32)})
    lstm_run = write_run(tmp_path / "lstm", ml_collections.ConfigDict(  # a causal LM, but without a KV cache
        {"model": {"family": "lstm", "vocab_size": V}, "data": {"vocab": None}}), {"w": np.zeros(2, np.float32)})
    cases = [
        ([f"--checkpoint={tmp_path / 'nothing'}", "--prompt=a"], "is not a bertology run (no config.json)"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt="], "prompt 0 ('') is empty"),
        ([f"--checkpoint={bert_run}", "--prompt=a"], "holds a model of the bert family, which has no incremental decoding"),
        ([f"--checkpoint={lstm_run}", "--prompt=a"], "holds a model of the lstm family, which has no incremental decoding"),
        ([f"--checkpoint={gpt_run[0]}"], "--checkpoint and one of --prompt (causal LM) or --source"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--source=b"], "--checkpoint and one of --prompt"),
        ([f"--checkpoint={gpt_run[0]}", "--source=a"], "continues a prompt; pass --prompt, not --source"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--top_p=0"], "0 < top_p <= 1"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--top_p=1.5", "--temperature=1"], "0 < top_p <= 1"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--temperature=-1"], "need temperature >= 0"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--max_new_tokens=0"], "max_new_tokens=0; ask for at least 1"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--num_samples=0"], "--num_samples=0; ask for at least 1"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=a", "--num_beams=2", "--temperature=0.5"],
         "beam search is deterministic"),
        ([f"--checkpoint={gpt_run[0]}", "--prompt=" + "a " * 200], "exceeds the model's context of"),
    ]
    for args, message in cases:
        assert cli.main(["bertology.generate", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bertology.generate: error:") and message in err[0], err


def test_benchmark_against_hugging_face_writes_json_and_markdown(tmp_path, hf_flax):
    from benchmarks import generation as bench

    rows = bench.main(["--preset", "tiny", "--vocab_size", "128", "--batch_sizes", "2", "--prompt_len", "4",
                       "--new_tokens", "3", "--repeats", "1", "--out", str(tmp_path)])
    (row,) = rows
    assert row["tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["hf_tokens_per_s"])
    (line,) = (tmp_path / "generation.jsonl").read_text().splitlines()
    assert json.loads(line) == row
    header, rule, cells = (tmp_path / "generation.md").read_text().splitlines()
    assert header.startswith("| preset | vocab_size | batch_size") and cells.startswith("| tiny | 128 | 2 | 1 | 4 | 3 |")


@pytest.mark.parametrize("recipe", ["t5", "bart"])
def test_beam_search_benchmark_decodes_what_transformers_decodes(recipe, tmp_path, monkeypatch, hf_flax):
    from benchmarks import generation as bench

    outputs = {}
    timed = bench.timed
    monkeypatch.setattr(bench, "timed", lambda runs, repeats: (outputs.update(ours=runs[0](), theirs=runs[1]()),
                                                              timed(runs, repeats))[1])
    (row,) = bench.main(["--recipe", recipe, "--preset", "tiny", "--vocab_size", "96", "--num_beams", "3",
                         "--batch_sizes", "2", "--prompt_len", "5", "--new_tokens", "4", "--repeats", "1",
                         "--out", str(tmp_path)])
    assert row["preset"] == f"{recipe}:tiny" and row["num_beams"] == 3
    assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["hf_tokens_per_s"])
    # The two sides are not the same random weights, so compare shapes and that each side decodes
    # every step (no EOS ends a hypothesis early): [batch, new_tokens] best hypotheses.
    assert outputs["ours"].shape == outputs["theirs"].shape == (2, 4)
    with pytest.raises(UserError, match="--num_beams is for --recipe t5 or bart"):
        bench.main(["--preset", "tiny", "--num_beams", "2", "--out", str(tmp_path)])
