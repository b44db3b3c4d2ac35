"""`model.vocab_multiple`: a token table padded to a multiple of rows computes what the unpadded
one does (BERT's MLM and GPT's causal LM losses and accuracies, GPT's greedy, sampled and beam
generation) even when the padded rows hold huge values, exports to Hugging Face without them and
imports with them; and the causal LM's chunked cross-entropy against the plain one."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

from bertology import models, objectives
from bertology.errors import UserError
from bertology.generation import beam_search, generate
from bertology.interop.hf import param_shapes, vocab_axes
from bertology.models.transformer import TransformerConfig
from bertology.objectives import causal_lm, chunked_token_nll, token_nll

V, L, B = 97, 12, 3
TINY = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=32,
            dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.3)
GPT = dict(TINY, family="gpt", type_vocab_size=0, embedding_norm=False, pooler=False, activation="gelu_tanh",
           layer_norm_eps=1e-5, norm="pre")
BERT = dict(TINY, family="bert")
HUGE = 1e4  # what the padded rows hold: any leak into a loss, an argmax or a draw would show


def build(block: dict, **edits) -> nn.Module:
    return models.build(ml_collections.ConfigDict({**block, **edits}))


def init(model: nn.Module, batch: dict, seed: int = 0) -> dict:
    return nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), batch)["params"])


def padded_copy(params: dict, model: nn.Module) -> dict:
    """The padded `model`'s parameters: `params`' real rows, HUGE in every padded row."""
    axes = vocab_axes(model)
    out = {}
    for k, shape in param_shapes(model).items():
        x = np.asarray(flatten_dict(params)[k])
        if k in axes:
            assert shape[axes[k]] > x.shape[axes[k]]
            widths = [(0, 0)] * x.ndim
            widths[axes[k]] = (0, shape[axes[k]] - x.shape[axes[k]])
            x = np.pad(x, widths, constant_values=HUGE)
        assert x.shape == shape, k
        out[k] = x
    return unflatten_dict(out)


def mlm_batch(rng: np.random.Generator) -> dict:
    predictions = 5
    return dict(input_ids=rng.integers(0, V, (B, L)).astype(np.int32), input_mask=np.ones((B, L), np.int32),
                segment_ids=(np.arange(L) >= L // 2).astype(np.int32)[None].repeat(B, 0),
                masked_positions=rng.integers(0, L, (B, predictions)).astype(np.int32),
                masked_ids=rng.integers(0, V, (B, predictions)).astype(np.int32),
                masked_weights=(rng.random((B, predictions)) > 0.2).astype(np.float32),
                next_sentence_label=rng.integers(0, 2, (B,)).astype(np.int32))


def lm_batch(rng: np.random.Generator, rows: int = B, length: int = L) -> dict:
    return dict(input_ids=rng.integers(0, V, (rows, length)).astype(np.int32),
                input_mask=np.ones((rows, length), np.int32),
                targets=rng.integers(0, V, (rows, length)).astype(np.int32),
                target_weights=(rng.random((rows, length)) > 0.2).astype(np.float32))


def metrics(objective: str | dict, params: dict, batch: dict, model: nn.Module) -> dict:
    _, m = jax.jit(lambda p: objectives.get(objective)(p, batch, None, model))(params)
    return {k: float(v) for k, v in m.items()}


def test_sizes_and_one_line_refusal():
    assert TransformerConfig(vocab_size=30522, vocab_multiple=128).padded_vocab_size == 30592
    assert TransformerConfig(vocab_size=50257, vocab_multiple=64).padded_vocab_size == 50304
    assert TransformerConfig(vocab_size=50257, vocab_multiple=128).padded_vocab_size == 50304
    assert TransformerConfig(vocab_size=50304, vocab_multiple=128).padded_vocab_size == 50304
    assert TransformerConfig(vocab_size=V).padded_vocab_size == V
    for bad in (0, -128):
        with pytest.raises(UserError, match=f"model.vocab_multiple={bad}: .*use 1") as e:
            build(GPT, vocab_multiple=bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("block, objective, batch", [(BERT, "bert", mlm_batch), (GPT, "causal_lm", lm_batch)])
def test_losses_and_accuracies_do_not_see_the_padded_rows(block, objective, batch):
    batch = batch(np.random.default_rng(0))
    plain, padded = build(block), build(block, vocab_multiple=128)
    params = init(plain, batch)
    big = padded_copy(params, padded)
    expected = metrics(objective, params, batch, plain)
    got = metrics(objective, big, batch, padded)
    assert expected.keys() == got.keys()
    for k in expected:
        assert abs(got[k] - expected[k]) <= 1e-6 * max(1.0, abs(expected[k])), (k, got[k], expected[k])
    if objective == "causal_lm":  # the chunked path slices the padded columns of each chunk too
        chunked = metrics({"name": objective, "chunk_tokens": 7}, big, batch, padded)
        assert all(abs(chunked[k] - expected[k]) <= 1e-6 * max(1.0, abs(expected[k])) for k in expected)
    logits = jax.jit(padded.apply)({"params": big}, batch)
    assert all(x.shape[-1] == V for x in jax.tree.leaves(logits) if x.ndim == 3)


def test_generation_never_emits_a_padded_id():
    rng = np.random.default_rng(1)
    ids = rng.integers(1, V, (4, 7)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    plain, padded = build(GPT), build(GPT, vocab_multiple=128)
    params = init(plain, lm_batch(rng))
    big = padded_copy(params, padded)
    for settings in (dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.7, top_k=5, seed=4)):
        expected = generate(plain, params, ids, mask, max_new_tokens=9, **settings)
        got = generate(padded, big, ids, mask, max_new_tokens=9, **settings)
        np.testing.assert_array_equal(got, expected)
        assert got.max() < V
    expected = beam_search(plain, params, ids, mask, num_beams=3, max_new_tokens=6)
    got = beam_search(padded, big, ids, mask, num_beams=3, max_new_tokens=6)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.scores, expected.scores, rtol=1e-6)
    assert got.tokens.max() < V


def test_hf_export_and_import_of_a_padded_gpt(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from safetensors.numpy import load_file

    from bertology.interop import export_hf, import_hf
    from bertology.interop.hf import write_run
    from bertology.train.checkpoint import load_params

    block = dict(GPT, vocab_multiple=128)
    model = build(block)
    rng = np.random.default_rng(2)
    params = unflatten_dict({k: rng.normal(0.0, 0.2, s).astype(np.float32) for k, s in param_shapes(model).items()})
    write_run(tmp_path / "run", block, params)
    (out,) = export_hf(tmp_path / "run", tmp_path / "hf")
    state = load_file(out / "model.safetensors")
    assert state["transformer.wte.weight"].shape == (V, TINY["hidden_size"])
    np.testing.assert_array_equal(state["transformer.wte.weight"],
                                  params["decoder"]["embeddings"]["token"]["embedding"][:V])

    batch = lm_batch(rng)
    ours = np.asarray(model.apply({"params": params}, batch)["logits"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(batch["input_ids"]).long()).logits.numpy()
    assert ours.shape == theirs.shape == (B, L, V)
    assert np.abs(ours - theirs).max() <= 1e-4

    for multiple in (128, 1):
        import_hf(out, tmp_path / f"back_{multiple}", vocab_multiple=multiple)
        back, run_config = load_params(tmp_path / f"back_{multiple}")
        assert run_config["model"].get("vocab_multiple", 1) == multiple
        table = back["decoder"]["embeddings"]["token"]["embedding"]
        assert table.shape[0] == (128 if multiple == 128 else V)
        np.testing.assert_array_equal(table[:V], params["decoder"]["embeddings"]["token"]["embedding"][:V])
        assert not np.any(table[V:])
        for k, v in flatten_dict(back).items():
            if k[-1] != "embedding" or "token" not in k:
                np.testing.assert_array_equal(v, flatten_dict(params)[k])
        logits = build(run_config["model"]).apply({"params": back}, batch)["logits"]
        np.testing.assert_array_equal(np.asarray(logits), ours)
        (again,) = export_hf(tmp_path / f"back_{multiple}", tmp_path / f"hf_{multiple}")
        again_state = load_file(again / "model.safetensors")
        assert again_state.keys() == state.keys()
        assert all(np.array_equal(again_state[k], state[k]) for k in state)


def _loss_and_grads(model: nn.Module, params: dict, batch: dict, chunk_tokens: int | None):
    """(lm_loss, lm_accuracy) and the parameter gradients: the plain logits' (None) or chunked."""
    def plain(p):
        logits = model.apply({"params": p}, batch)["logits"]
        nll, correct = token_nll(logits, batch["targets"])
        return objectives.Terms({"lm_loss": 1.0}, objectives.token_means(nll, correct, batch["target_weights"], "lm"))

    def terms(p):
        t = plain(p) if chunk_tokens is None else causal_lm.loss(p, batch, None, model, chunk_tokens=chunk_tokens)
        return t.loss_value(), objectives.divided(t.means)["lm_accuracy"]

    return jax.jit(jax.value_and_grad(terms, has_aux=True))(params)


@pytest.mark.parametrize("multiple", [1, 128])
def test_chunked_cross_entropy_equals_the_plain_one(multiple):
    rng = np.random.default_rng(3)
    batch = lm_batch(rng, rows=2, length=13)  # 26 tokens: chunks of 5 positions (chunk_tokens 10 or 11) do not divide
    model = build(GPT, vocab_multiple=multiple)
    params = init(model, batch)
    (loss, accuracy), grads = _loss_and_grads(model, params, batch, None)
    for chunk_tokens in (10, 11, 2, 1, 4096):
        (got, got_accuracy), got_grads = _loss_and_grads(model, params, batch, chunk_tokens)
        assert abs(float(got) - float(loss)) <= 1e-5 * abs(float(loss))
        assert float(got_accuracy) == float(accuracy)
        # relative to each leaf, plus 1e-6 of the largest gradient: the keys' bias has a gradient
        # of zero (softmax ignores a constant), which two summation orders round differently
        floor = 1e-6 * max(float(jnp.max(jnp.abs(g))) for g in flatten_dict(grads).values())
        for k, g in flatten_dict(grads).items():
            tolerance = 1e-5 * float(jnp.max(jnp.abs(g))) + floor
            assert float(jnp.max(jnp.abs(flatten_dict(got_grads)[k] - g))) <= tolerance, (chunk_tokens, k)


def test_chunked_cross_entropy_never_holds_all_logits():
    """No value of the loss's or its gradient's program outside the chunk loop is [tokens, vocab]
    or larger: the backward pass recomputes each chunk's logits instead of saving them."""
    rows, length, hidden, vocab = 2, 64, 16, 1000
    cfg = TransformerConfig(vocab_size=vocab, hidden_size=hidden, num_heads=2)
    rng = np.random.default_rng(4)
    states = jnp.asarray(rng.normal(size=(rows, length, hidden)), jnp.float32)
    table = jnp.asarray(rng.normal(size=(vocab, hidden)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32)

    def total(s, t):
        return jnp.sum(chunked_token_nll(s, t, labels, cfg, chunk_tokens=16)[0])

    jaxpr = jax.make_jaxpr(jax.grad(total, argnums=(0, 1)))(states, table).jaxpr
    sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars]
    assert max(sizes) < rows * length * vocab
    assert any(eqn.primitive.name == "scan" for eqn in jaxpr.eqns)


def test_chunked_cross_entropy_in_bfloat16_stays_close():
    rows, length, hidden, vocab = 2, 20, 16, 300
    rng = np.random.default_rng(5)
    states = jnp.asarray(rng.normal(size=(rows, length, hidden)), jnp.float32)
    table = jnp.asarray(rng.normal(size=(vocab, hidden)) * 0.3, jnp.float32)
    labels = jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32)
    f32 = chunked_token_nll(states, table, labels, TransformerConfig(vocab_size=vocab, hidden_size=hidden, num_heads=2),
                            chunk_tokens=8)[0]
    bf16_cfg = TransformerConfig(vocab_size=vocab, hidden_size=hidden, num_heads=2, dtype="bfloat16")
    bf16 = chunked_token_nll(states.astype(jnp.bfloat16), table, labels, bf16_cfg, chunk_tokens=8)[0]
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(bf16), np.asarray(f32), rtol=3e-2, atol=3e-2)


def test_chunked_cross_entropy_backward_products_run_in_bfloat16():
    """In bfloat16 every product of the loss's gradient takes bfloat16 operands (float32
    accumulation): left to autodiff, the float32 logits' gradient promoted both backward
    products to float32, which an H100 runs as TF32 at a fraction of the bfloat16 rate."""
    rows, length, hidden, vocab = 2, 16, 16, 300
    cfg = TransformerConfig(vocab_size=vocab, hidden_size=hidden, num_heads=2, dtype="bfloat16", vocab_multiple=128)
    rng = np.random.default_rng(6)
    states = jnp.asarray(rng.normal(size=(rows, length, hidden)), jnp.bfloat16)
    table = jnp.asarray(rng.normal(size=(cfg.padded_vocab_size, hidden)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32)

    def total(s, t):
        return jnp.sum(chunked_token_nll(s, t, labels, cfg, chunk_tokens=8)[0])

    text = jax.jit(jax.grad(total, argnums=(0, 1))).lower(states, table).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line and "=" in line]
    assert len(dots) >= 3  # the forward product and the two backward ones
    for line in dots:
        operands, result = line.rsplit(" : ", 1)[1].split("->")  # "(tensor<..xbf16>, tensor<..xbf16>) -> tensor<..xf32>"
        assert "f32" not in operands and "f32" in result, line
