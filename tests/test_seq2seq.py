"""Encoder-decoder families (T5, BART, MASS's BART network) and the seq2seq objective: the loss
against a numpy reference (with and without label smoothing), the configs building and learning
on hand-made batches, BART's untrained output bias, MASS's decoder positions, T5's head width and
output scaling, and the FLOP count against XLA's own count of the compiled forward pass."""

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertology import models, objectives
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.models import flops
from bertology.models.transformer import shift_right
from bertology.train import optimizer as optimizer_lib
from bertology.train.step import make_train_step, state_init


def random_batch(rng, vocab: int, b: int, source: int, target: int, start: int) -> dict:
    """Right-padded sources and targets; decoder input = targets shifted right with `start`."""
    source_mask = (np.arange(source)[None] < rng.integers(source // 2, source + 1, (b, 1))).astype(np.int32)
    target_mask = (np.arange(target)[None] < rng.integers(target // 2, target + 1, (b, 1))).astype(np.int32)
    targets = (rng.integers(3, vocab, (b, target)) * target_mask).astype(np.int32)
    return dict(input_ids=(rng.integers(3, vocab, (b, source)) * source_mask).astype(np.int32),
                input_mask=source_mask, decoder_input_ids=np.asarray(shift_right(jnp.asarray(targets), start)),
                decoder_input_mask=target_mask, targets=targets, target_weights=target_mask.astype(np.float32))


def tiny(spec: str, **model) -> tuple[ml_collections.ConfigDict, nn.Module]:
    c = helpers.config(*spec.split(":"))  # spec: "<name>:<preset>"
    c.model.vocab_size = load_tokenizer(c.data.vocab).vocab_size
    c.model.update(model)
    return c, models.build(c.model)


# ---------------------------------------------------------------- objective


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_objective_matches_numpy(smoothing):
    c, model = tiny("t5:tiny", vocab_size=50, dropout_rate=0.0, attention_dropout_rate=0.0)
    batch = random_batch(np.random.default_rng(0), 50, 3, 12, 8, start=0)
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    objective = objectives.get({"name": "seq2seq", "label_smoothing": smoothing})
    loss, metrics = jax.jit(lambda p: objective(p, batch, None, model))(params)

    logits = np.asarray(jax.jit(model.apply)({"params": params}, batch)["logits"], np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
    w = batch["target_weights"]
    mean = lambda x: (x * w).sum() / (w.sum() + 1e-5)  # noqa: E731
    smoothed = (1 - smoothing) * nll + smoothing * -logp.mean(-1)
    assert float(metrics["lm_loss"]) == pytest.approx(mean(nll), rel=1e-5)
    assert float(loss) == pytest.approx(mean(smoothed), rel=1e-5)
    assert float(metrics["perplexity"]) == pytest.approx(np.exp(mean(nll)), rel=1e-5)
    assert float(metrics["lm_accuracy"]) == pytest.approx(mean(logits.argmax(-1) == batch["targets"]), abs=1e-6)


def test_label_smoothing_out_of_range_is_refused():
    c, model = tiny("bart:tiny", vocab_size=50)
    batch = random_batch(np.random.default_rng(0), 50, 2, 6, 4, start=2)
    params = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]  # refused before any compute
    with pytest.raises(UserError, match=r"label_smoothing=1.0 must be in \[0, 1\)"):
        objectives.get({"name": "seq2seq", "label_smoothing": 1.0})(params, batch, None, model)


# ---------------------------------------------------------------- configs learn


@pytest.mark.parametrize("spec, start", [("t5:tiny", 0), ("t5:v1_1_tiny", 0), ("bart:tiny", 2), ("mass:tiny", 2)])
def test_tiny_configs_build_and_learn(spec, start):
    c, model = tiny(spec)
    assert c.objective == "seq2seq"
    assert c.data.objective == {"t5": "span_corruption", "bart": "bart", "mass": "mass"}[spec.split(":")[0]]
    vocab, length, target = c.model.vocab_size, c.data.max_seq_length, c.data.max_target_length
    batch = random_batch(np.random.default_rng(1), vocab, 4, length, target, start)
    c.optimizer.update(warmup_steps=1, learning_rate=3e-3)
    tx, lr = optimizer_lib.make(c.optimizer, 1000)
    objective = objectives.get(c.objective)
    state = jax.jit(state_init(model, tx, batch))(jax.random.key(0))
    state = jax.tree.map(lambda x: x, nn.meta.unbox(state))
    step = jax.jit(make_train_step(model, objective, tx, lr, 1))
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    print(f"\n{spec}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[0] == pytest.approx(np.log(vocab), rel=0.1)  # a fresh model predicts about uniformly
    assert losses[-1] < 0.7 * losses[0]  # it memorises the batch


def test_bart_output_bias_is_used_but_never_trained():
    """HF keeps `final_logits_bias` constant (a buffer; `stop_gradient` in Flax): imported values
    shift the logits, and training (AdamW with weight decay) leaves them exactly as they were."""
    c, model = tiny("bart:tiny", vocab_size=40, dropout_rate=0.0, attention_dropout_rate=0.0)
    batch = random_batch(np.random.default_rng(2), 40, 2, 8, 6, start=2)
    c.optimizer.update(warmup_steps=1, learning_rate=1e-2, weight_decay=0.1)
    tx, lr = optimizer_lib.make(c.optimizer, 100)
    state = jax.tree.map(lambda x: x, nn.meta.unbox(jax.jit(state_init(model, tx, batch))(jax.random.key(0))))
    bias = np.random.default_rng(3).normal(size=40).astype(np.float32)
    state["params"]["final_logits_bias"] = jnp.asarray(bias)
    apply = jax.jit(model.apply)
    logits = apply({"params": state["params"]}, batch)["logits"]
    unbiased = apply({"params": {**state["params"], "final_logits_bias": jnp.zeros(40)}}, batch)["logits"]
    np.testing.assert_allclose(logits - unbiased, np.broadcast_to(bias, logits.shape), atol=1e-5)

    before = jax.tree.map(np.asarray, state["params"])
    step = jax.jit(make_train_step(model, objectives.get(c.objective), tx, lr, 1))
    for _ in range(3):
        state, _ = step(state, batch, jax.random.key(1))
    np.testing.assert_array_equal(state["params"]["final_logits_bias"], bias)
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, jax.tree.map(np.asarray, state["params"]))
    assert sum(jax.tree.leaves(moved)) == len(jax.tree.leaves(moved)) - 1  # everything else trains


def test_t5_presets_follow_the_papers():
    v10, v11 = helpers.config("t5", "small"), helpers.config("t5", "v1_1_small")
    assert (v10.model.num_layers, v10.model.hidden_size, v10.model.num_heads, v10.model.intermediate_size) == (6, 512, 8, 2048)
    assert (v11.model.num_layers, v11.model.num_heads, v11.model.head_size, v11.model.intermediate_size) == (8, 6, 64, 1024)
    assert (v10.model.activation, v10.model.tie_embeddings, v11.model.activation, v11.model.tie_embeddings) == (
        "relu", True, "gated_gelu", False)
    base_config = helpers.config("t5", "base")
    assert base_config.data.extra_ids == 100  # the vocabulary: data.vocab + 100 sentinels
    base_config.model.vocab_size = 32128  # Google's t5-base table (32,100 padded to a multiple of 128)
    base = models.build(base_config.model)
    example = random_batch(np.random.default_rng(0), 9, 1, 4, 3, 0)
    shapes = jax.eval_shape(lambda: base.init(jax.random.key(0), example))
    count = sum(np.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(shapes["params"])))
    assert count == pytest.approx(222.9e6, rel=0.01)  # T5-base: "about 220M" (HF t5-base: 222.9M)
    bart = helpers.config("bart", "base")
    assert bart.model.max_position_embeddings == 514 and bart.model.position_offset == 2


# ---------------------------------------------------------------- model details


def test_t5_v1_0_scales_the_tied_output_and_v1_1_does_not():
    _, v10 = tiny("t5:tiny", vocab_size=40)
    batch = random_batch(np.random.default_rng(2), 40, 2, 6, 5, start=0)
    params = jax.jit(v10.init)(jax.random.key(0), batch)["params"]
    states = jax.jit(lambda p: v10.apply({"params": p}, batch, method=lambda m, b: super(type(m), m).__call__(b)))(params)
    table = np.asarray(nn.meta.unbox(params)["encoder"]["embeddings"]["token"]["embedding"])
    expected = np.asarray(states) * 128 ** -0.5 @ table.T
    np.testing.assert_allclose(jax.jit(v10.apply)({"params": params}, batch)["logits"], expected, atol=1e-5)
    _, v11 = tiny("t5:v1_1_tiny", vocab_size=40)
    params = nn.meta.unbox(jax.eval_shape(v11.init, jax.random.key(0), batch)["params"])
    assert params["lm_head"]["kernel"].shape == (128, 40) and "bias" not in params["lm_head"]
    assert params["encoder"]["attention_0"]["query"]["kernel"].shape == (128, 2, 64)


def test_mass_decoder_reads_its_positions_and_t5_has_none():
    """MASS feeds the fragment at its original positions: BART's network reads `decoder_positions`;
    T5's relative positions make them irrelevant."""
    batch = random_batch(np.random.default_rng(3), 40, 2, 8, 4, start=2)
    moved = {**batch, "decoder_positions": np.broadcast_to(np.arange(3, 7), (2, 4)).astype(np.int32)}
    for spec, moves in (("mass:tiny", True), ("t5:tiny", False)):
        _, model = tiny(spec, vocab_size=40)
        params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
        apply = jax.jit(model.apply)
        a = np.asarray(apply({"params": params}, batch)["logits"])
        b = np.asarray(apply({"params": params}, moved)["logits"])
        assert (np.abs(a - b).max() > 1e-3) == moves, spec


@pytest.mark.parametrize("decoder_layers", [None, 1])
def test_encoder_decoder_flops_match_xla(decoder_layers):
    """Our count of a forward pass (training FLOPs / 3) against XLA's count of the compiled
    forward of T5 v1.1-tiny (matmuls dominate; XLA also counts norms, softmax, activations),
    and of the same with a one-layer decoder."""
    c, model = tiny("t5:v1_1_tiny", vocab_size=512, num_decoder_layers=decoder_layers)
    c.data.update(max_seq_length=64, max_target_length=16)
    batch = random_batch(np.random.default_rng(4), 512, 2, 64, 16, start=0)
    params = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]  # shapes are all lowering needs
    compiled = jax.jit(lambda p, b: model.apply({"params": p}, b)["logits"]).lower(params, batch).compile()
    xla = compiled.cost_analysis()["flops"]
    ours = models.flops_per_token(c) / flops.TRAIN * 2 * 64
    print(f"\nforward FLOPs (decoder layers {decoder_layers}): ours {ours:.4g}, XLA {xla:.4g}")
    assert ours == pytest.approx(xla, rel=0.05)


def test_encoder_decoder_flops_count_each_stack_at_its_own_depth():
    """A 2-layer encoder with a 1-layer decoder: between the 1/1 and 2/2 models, and equal to the
    count by hand (per source token, training = 3 x forward, 2 FLOPs per multiply-add): each
    encoder layer over S source tokens projects keys, values, queries and output (4 h·a each),
    runs the gated MLP (3 h·i) and scores and context (2 S·a); each decoder layer over T target
    tokens does the same with T, plus cross-attention: keys and values of the S source tokens,
    queries and output at the T targets, scores and context over S; the untied output layer
    (h·vocab) at every target."""
    c, _ = tiny("t5:v1_1_tiny", vocab_size=300, num_decoder_layers=1)
    c.data.update(max_seq_length=32, max_target_length=8)
    S, T, h, a, i, vocab = 32, 8, 128, 2 * 64, 512, 300
    assert (c.model.hidden_size, c.model.num_heads * c.model.head_size, c.model.intermediate_size) == (h, a, i)

    def by_hand(encoder: int, decoder: int) -> float:
        encoder_layer = S * (2 * 4 * h * a + 2 * 3 * h * i + 2 * 2 * S * a)
        decoder_layer = (T * (2 * 4 * h * a + 2 * 3 * h * i + 2 * 2 * T * a)  # self-attention and MLP
                         + S * 2 * 2 * h * a + T * (2 * 2 * h * a + 2 * 2 * S * a))  # cross-attention
        return 3 * (encoder * encoder_layer + decoder * decoder_layer + T * 2 * h * vocab) / S

    def counted(encoder: int, decoder: int | None) -> float:
        c.model.update(num_layers=encoder, num_decoder_layers=decoder)
        return models.flops_per_token(c)

    uneven = counted(2, 1)
    assert counted(1, None) < uneven < counted(2, None)
    assert counted(1, 1) == counted(1, None) and counted(2, 2) == counted(2, None)
    assert uneven == pytest.approx(by_hand(2, 1), rel=1e-12)
    assert counted(1, 2) == pytest.approx(by_hand(1, 2), rel=1e-12) != uneven
    assert counted(2, None) == pytest.approx(by_hand(2, 2), rel=1e-12)


def test_t5_init_is_mesh_tensorflows_fan_in():
    """Embeddings N(0, 1); every matrix std 1/sqrt(fan-in); queries also x 1/sqrt(d_kv) (T5's
    unscaled scores). A BERT-initialised model keeps 0.02 (x 0.88 for the 2-sigma truncation)."""
    _, model = tiny("t5:tiny", vocab_size=3000)
    batch = random_batch(np.random.default_rng(5), 3000, 1, 4, 3, start=0)
    p = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch)["params"])
    enc = p["encoder"]
    stds = {"token": enc["embeddings"]["token"]["embedding"], "query": enc["attention_0"]["query"]["kernel"],
            "key": enc["attention_0"]["key"]["kernel"], "output": enc["attention_0"]["output"]["kernel"],
            "wo": enc["ffn_0"]["output"]["kernel"]}
    want = {"token": 1.0, "query": (128 * 64) ** -0.5, "key": 128 ** -0.5, "output": (2 * 64) ** -0.5, "wo": 512 ** -0.5}
    for name, w in stds.items():
        assert float(np.std(w)) == pytest.approx(want[name], rel=0.05), name
    _, bert_init = tiny("t5:tiny", vocab_size=3000, init_scheme="bert")
    q = nn.meta.unbox(jax.jit(bert_init.init)(jax.random.key(0), batch)["params"])["encoder"]["attention_0"]["query"]["kernel"]
    assert float(np.std(q)) == pytest.approx(0.02 * 0.88, rel=0.05)


@pytest.mark.parametrize("spec, decoder_layers", [("t5:v1_1_tiny", None), ("bart:tiny", None), ("t5:v1_1_tiny", 3)])
def test_scanned_encoder_decoder_equals_unscanned(spec, decoder_layers):
    from bertology.models.transformer import stack_layers

    settings = dict(vocab_size=60, dropout_rate=0.0, attention_dropout_rate=0.0, num_decoder_layers=decoder_layers)
    _, model = tiny(spec, **settings)
    _, scanned = tiny(spec, scan_layers=True, **settings)
    batch = random_batch(np.random.default_rng(6), 60, 2, 10, 6, start=0)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch)["params"])
    depth = model.cfg.decoder_layers
    stacked = {**params, "encoder": stack_layers(params["encoder"], 2),
               "decoder": stack_layers(params["decoder"], depth)}
    assert jax.tree.map(np.shape, stack_layers(params["decoder"])) == jax.tree.map(np.shape, stacked["decoder"])
    assert stacked["decoder"]["layers"]["cross_attention"]["query"]["kernel"].shape[0] == depth
    if depth != 2:  # the encoder's depth would drop or miss decoder layers
        with pytest.raises(ValueError, match=f"num_layers=2, but the stack has {depth} layers"):
            stack_layers(params["decoder"], 2)
    assert jax.tree.map(np.shape, stacked) == jax.tree.map(
        np.shape, nn.meta.unbox(jax.eval_shape(scanned.init, jax.random.key(0), batch)["params"]))
    np.testing.assert_allclose(jax.jit(scanned.apply)({"params": stacked}, batch)["logits"],
                               jax.jit(model.apply)({"params": params}, batch)["logits"], atol=1e-5)


def test_a_decoder_without_layers_is_refused():
    with pytest.raises(UserError, match=r"model\.num_decoder_layers=0: the decoder needs at least one layer"):
        tiny("bart:tiny", vocab_size=60, num_decoder_layers=0)


def test_a_batch_without_its_source_is_refused_outside_decoding():
    _, model = tiny("bart:tiny", vocab_size=60)
    batch = random_batch(np.random.default_rng(7), 60, 2, 6, 4, start=2)
    params = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]
    no_source = {k: v for k, v in batch.items() if k not in ("input_ids", "input_mask")}
    with pytest.raises(UserError, match="an encoder-decoder batch needs input_ids"):
        jax.eval_shape(lambda p: model.apply({"params": p}, no_source), params)  # refused while tracing
