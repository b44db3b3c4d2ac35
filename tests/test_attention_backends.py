"""The attention backends' conformance suite: every backend (`xla`, `splash` in Pallas interpret
mode on CPU, `cudnn` where a GPU is) against a float64 numpy reference, forward and gradient, on
every mask kind (padding, packed documents, causal, packed causal, sliding windows (banded on
xla, O(length · window)), prefix LM,
UniLM's per-row kinds, XLNet's explicit masks, the last layer's gathered rows) at odd lengths and
head counts;
the dispatch rule (`attention.choose`) per platform; and a packed row giving each document what
it gets alone."""

import json

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertology.errors import UserError
from bertology.models.attention import FusedMask, attend, choose
from bertology.models.transformer import Mask

B, H, D = 2, 3, 16
WINDOW = 9  # keys on each side of a sliding window
SEGMENT_KINDS = ["padding", "packed", "causal", "packed causal", "sliding window", "causal sliding window"]
ON_CPU = ["xla", "splash"]  # splash runs in Pallas interpret mode off TPU


def reference(q, k, v, visible, weights):
    """float64 (output, d(sum(weights · output))/d(q, k, v)): softmax(q·k / sqrt(d)) over the
    visible keys, times v, and its backward written out."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, weights))
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(visible[:, None], s, -1e300)  # finite: a padded query that sees nothing comes out uniform
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p, v)
    d_out = np.swapaxes(w, 1, 2)  # [b, h, q, d]
    d_v = np.einsum("bhqk,bhqd->bkhd", p, d_out)
    d_p = np.einsum("bhqd,bkhd->bhqk", d_out, v)
    d_s = p * (d_p - (d_p * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return out, (np.einsum("bhqk,bkhd->bqhd", d_s, k), np.einsum("bhqk,bqhd->bkhd", d_s, q), d_v)


def visibility(kind, length, lengths, docs, prefix, kinds):
    """[batch, q, k] who may see whom, from the definitions (not from `Mask`)."""
    real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    vis = np.broadcast_to(real[:, None, :], (B, length, length)).copy()
    pos = np.arange(length)
    before = pos[None, :] <= pos[:, None]
    if kind in ("packed", "packed causal"):
        vis &= docs[:, :, None] == docs[:, None, :]
    if kind in ("causal", "packed causal", "causal sliding window"):
        vis &= before
    if kind.endswith("sliding window"):
        vis &= np.abs(pos[:, None] - pos[None, :]) <= WINDOW
    if kind == "prefix":
        vis &= before | (pos[None, None, :] < np.asarray(prefix)[:, None, None])
    if kind == "per-row kinds":  # row 0 right-to-left, row 1 bidirectional
        vis[0] &= pos[None, :] >= pos[:, None]
    return vis


def case(kind, length=77, seed=0):
    """(q, k, v, Mask, visible [b, q, k], weights: 0 at padded queries) for a mask kind."""
    rng = np.random.default_rng(seed)
    lengths = [length, length - 20]
    docs = np.where(np.arange(length) < 30, 1, 2)[None].repeat(B, 0)
    docs = np.where(np.arange(length)[None] < np.asarray(lengths)[:, None], docs, 0)
    prefix, kinds = np.array([10, 25]), np.array([Mask.KINDS.index("right_to_left"), 0])
    keys = jnp.asarray(np.arange(length)[None] < np.asarray(lengths)[:, None])
    mask = {"padding": Mask(keys=keys),
            "packed": Mask(keys=keys, documents=jnp.asarray(docs)),
            "causal": Mask(keys=keys, causal=True),
            "packed causal": Mask(keys=keys, documents=jnp.asarray(docs), causal=True),
            "prefix": Mask(keys=keys, prefix=jnp.asarray(prefix), causal=True),
            "per-row kinds": Mask(keys=keys, kinds=jnp.asarray(kinds)),
            "sliding window": Mask(keys=keys, window=WINDOW),
            "causal sliding window": Mask(keys=keys, causal=True, window=WINDOW)}[kind]
    q, k, v = (jnp.asarray(rng.normal(size=(B, length, H, D)), jnp.float32) for _ in range(3))
    weights = rng.normal(size=(B, length, H, D)) * np.asarray(keys)[:, :, None, None]
    return q, k, v, mask, visibility(kind, length, lengths, docs, prefix, kinds), weights


def output_and_grads(attention, weights, *inputs):
    """float64 (attention(*inputs), d(sum(weights · output))/d(each input))."""
    def loss(*inputs):
        out = attention(*inputs)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(inputs))), has_aux=True))(*inputs)
    return np.asarray(out, np.float64), [np.asarray(g, np.float64) for g in grads]


def run(backend, q, k, v, mask, weights, rows=None):
    allowed, is_causal = mask.lower(rows)
    fused = mask.fused(q.shape[1], rows)
    return output_and_grads(lambda q, k, v: attend(q, k, v, allowed=allowed, is_causal=is_causal, backend=backend,
                                                   fused=fused), weights, q, k, v)


def assert_conforms(got, want, real_queries, tol):
    out, grads = got
    want_out, want_grads = want
    np.testing.assert_allclose(out[real_queries], want_out[real_queries], rtol=tol, atol=tol)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", ON_CPU)
@pytest.mark.parametrize("kind", SEGMENT_KINDS)
def test_segment_kinds_match_the_reference(backend, kind):
    q, k, v, mask, visible, weights = case(kind)
    want = reference(q, k, v, visible, weights)
    assert_conforms(run(backend, q, k, v, mask, weights), want, np.asarray(mask.keys), 2e-5)
    # the mask is felt: the plain padding reference differs wherever the kind restricts more
    if kind != "padding":
        plain = reference(q, k, v, visibility("padding", 77, [77, 57], None, None, None), weights)[0]
        assert np.abs(plain - want[0])[np.asarray(mask.keys)].max() > 1e-2


@pytest.mark.parametrize("kind", ["sliding window", "causal sliding window"])
def test_xla_runs_a_sliding_window_banded(kind):
    """On xla a sliding window over segments costs O(length · window): no array of the traced
    forward and backward pass has two axes as long as the row (the masked square would)."""
    q, k, v, mask, _, weights = case(kind)
    fused = mask.fused(q.shape[1])
    loss = lambda q, k, v: jnp.sum(attend(q, k, v, backend="xla", fused=fused) * weights)  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr
    shapes = [var.aval.shape for eqn in jaxpr.eqns for var in eqn.outvars]
    assert not any(sum(n >= q.shape[1] for n in shape) >= 2 for shape in shapes), "a square was built"


@pytest.mark.parametrize("kind", ["prefix", "per-row kinds"])
def test_per_row_kinds_run_on_xla_and_splash_refuses_them(kind):
    q, k, v, mask, visible, weights = case(kind)
    assert_conforms(run("xla", q, k, v, mask, weights), reference(q, k, v, visible, weights), np.asarray(mask.keys),
                    2e-5)
    assert mask.fused(77).query is None
    with pytest.raises(UserError, match=f"splash.*no form for the {kind} mask"):
        run("splash", q, k, v, mask, weights)
    np.testing.assert_array_equal(run("auto", q, k, v, mask, weights)[0], run("xla", q, k, v, mask, weights)[0])


@pytest.mark.parametrize("backend", ON_CPU)
@pytest.mark.parametrize("kind", ["padding", "packed", "sliding window"])
def test_gathered_rows_match_the_full_layer(backend, kind):
    """The last layer's queries at the read positions only (MLM's gathered rows): each row is
    what the full square gives there. Splash's masks are static, so a window around rows chosen
    per batch has no splash form."""
    q, k, v, mask, visible, weights = case(kind, length=150, seed=3)
    rows = jnp.asarray([[0, 5, 40, 149], [1, 2, 33, 100]])
    take = np.asarray(rows)
    q_rows = q[jnp.arange(B)[:, None], rows]
    w_rows = weights[np.arange(B)[:, None], take]
    want = reference(q_rows, k, v, visible[np.arange(B)[:, None], take], w_rows)
    if backend == "splash" and kind == "sliding window":
        with pytest.raises(UserError, match="no form for the sliding window at chosen rows mask"):
            run(backend, q_rows, k, v, mask, w_rows, rows=rows)
        return
    got = run(backend, q_rows, k, v, mask, w_rows, rows=rows)
    real = np.take_along_axis(np.asarray(mask.keys), take, axis=1)
    assert_conforms(got, want, real, 2e-5)


@pytest.mark.parametrize("kind", ["padding", "packed", "padding with a score bias"])
def test_cudnn_path_pads_an_odd_query_count_and_drops_the_pad(kind):
    """cuDNN refuses odd query counts (the last layer's gathered MLM rows often are), so its
    path pads one query that sees what the last one sees and drops its output. Run through
    xla's implementation here (the same code path but the kernel): the outputs and the
    gradients of q, k, v and the bias equal the unpadded attention's."""
    from bertology.models.attention import _cudnn

    q, k, v, mask, _, weights = case(kind.split(" ")[0], length=150, seed=4)
    rows = jnp.asarray([[0, 5, 40, 99, 149], [1, 2, 33, 77, 100]])  # 5: odd
    q_rows, w_rows = q[jnp.arange(B)[:, None], rows], weights[np.arange(B)[:, None], np.asarray(rows)]
    allowed, is_causal = mask.lower(rows)
    fused = mask.fused(q_rows.shape[1], rows)
    bias = jnp.asarray(np.random.default_rng(2).normal(size=(1, H, 5, 150)), jnp.float32) if "bias" in kind else None

    inputs = (q_rows, k, v, jnp.zeros(()) if bias is None else bias)
    padded = output_and_grads(lambda q, k, v, b: _cudnn(q, k, v, allowed, is_causal, None if bias is None else b,
                                                        None, fused, implementation="xla"), w_rows, *inputs)
    plain = output_and_grads(lambda q, k, v, b: attend(q, k, v, allowed=allowed, is_causal=is_causal,
                                                       bias=None if bias is None else b, backend="xla", fused=fused),
                             w_rows, *inputs)
    assert padded[0].shape == plain[0].shape == (B, 5, H, D)
    traced = jax.make_jaxpr(lambda q: _cudnn(q, k, v, allowed, is_causal, bias, None, fused, implementation="xla"))(q_rows)
    assert any(x.aval.shape == (B, 6, H, D) for e in traced.eqns for x in e.outvars)  # the kernel sees 6 queries
    real = np.take_along_axis(np.asarray(mask.keys), np.asarray(rows), axis=1)
    np.testing.assert_allclose(padded[0][real], plain[0][real], rtol=1e-5, atol=1e-5)
    for got, want in zip(padded[1], plain[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_serves_an_odd_number_of_gathered_rows():
    """BERT-base 32×512's last layer: 81 gathered queries (80 predictions + [CLS]) against 512
    keys, which cuDNN refused before the padding (run 7): the probe now takes it."""
    from bertology.models.attention import _probe_cudnn, _signature

    q = jnp.zeros((2, 81, 12, 64), jnp.bfloat16)
    k = v = jnp.zeros((2, 512, 12, 64), jnp.bfloat16)
    mask = Mask(keys=jnp.ones((2, 512), bool))
    rows = jnp.zeros((2, 81), jnp.int32)
    allowed, is_causal = mask.lower(rows)
    assert _probe_cudnn("auto", _signature(q, k, v, allowed, is_causal, None, None, mask.fused(81, rows))) == \
        ("cudnn", "")


@pytest.mark.parametrize("backend", ON_CPU)
def test_a_packed_row_gives_each_document_what_it_gets_alone(backend):
    """Documents packed into one row never see each other: each one's outputs equal those of
    the document run alone (MaxText's cuDNN path once attended across them silently)."""
    q, k, v, mask, _, weights = case("packed causal", length=130, seed=5)
    out, _ = run(backend, q, k, v, mask, weights)
    for lo, hi in ((0, 30), (30, 130)):
        alone = Mask(keys=jnp.ones((B, hi - lo), bool), causal=True)
        got, _ = run(backend, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], alone, weights[:, lo:hi])
        np.testing.assert_allclose(out[0, lo:hi], got[0], rtol=2e-5, atol=2e-5)


def test_explicit_masks_and_biases_stay_on_xla():
    """XLNet's explicit masks and the families' additive score terms: xla only; splash refuses
    them with the reason, auto runs xla."""
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.normal(size=(B, 9, H, D)), jnp.float32) for _ in range(3))
    explicit = jnp.asarray(rng.random((B, 9, 9)) < 0.7) | jnp.eye(9, dtype=bool)
    mask = Mask(keys=jnp.ones((B, 9), bool), explicit=explicit)
    assert mask.fused(9).kind == "explicit" and mask.fused(9).query is None
    with pytest.raises(UserError, match="no form for the explicit mask"):
        attend(q, k, v, allowed=mask.lower()[0], backend="splash", fused=mask.fused(9))
    bias = jnp.asarray(rng.normal(size=(1, H, 9, 9)), jnp.float32)
    with pytest.raises(UserError, match="takes no additive score bias"):
        attend(q, k, v, bias=bias, backend="splash", fused=Mask(keys=jnp.ones((B, 9), bool)).fused(9))
    np.testing.assert_array_equal(attend(q, k, v, bias=bias, backend="auto"), attend(q, k, v, bias=bias))


PADDING = FusedMask(kind="padding", query=np.ones((1, 1)), key=np.ones((1, 1)))
PACKED = FusedMask(kind="packed causal", query=np.ones((1, 1)), key=np.ones((1, 1)), causal=True)
LOOK_BACK = FusedMask(kind="causal sliding window", query=np.ones((1, 1)), key=np.ones((1, 1)), causal=True, window=8)
TWO_SIDED = FusedMask(kind="sliding window", query=np.ones((1, 1)), key=np.ones((1, 1)), window=8)


@pytest.mark.parametrize("platform,dtype,mask,bias,dropout,want", [
    ("cpu", "bfloat16", PADDING, False, False, "xla"),
    ("gpu", "bfloat16", PADDING, False, False, "cudnn"),
    ("gpu", "bfloat16", PACKED, False, False, "cudnn"),
    ("gpu", "float32", PADDING, False, False, "xla"),  # cuDNN runs half precision only
    ("gpu", "bfloat16", PADDING, False, True, "xla"),  # attention dropout while training
    ("gpu", "bfloat16", PADDING, True, False, "xla"),  # T5's learned bucket bias
    ("gpu", "bfloat16", FusedMask(kind="prefix"), False, False, "xla"),
    ("gpu", "bfloat16", LOOK_BACK, False, False, "cudnn"),
    ("gpu", "bfloat16", TWO_SIDED, False, False, "xla"),  # cuDNN's windows look back only
    ("tpu", "bfloat16", TWO_SIDED, False, False, "splash"),
    ("tpu", "bfloat16", PACKED, False, False, "splash"),
    ("tpu", "float32", PADDING, False, False, "splash"),
    ("tpu", "bfloat16", PADDING, True, False, "xla"),
    ("tpu", "bfloat16", FusedMask(kind="per-row kinds"), False, False, "xla"),
])
def test_auto_picks_the_fastest_backend_that_serves_the_mask(platform, dtype, mask, bias, dropout, want):
    chosen, why = choose("auto", platform=platform, dtype=dtype, head_dim=64, mask=mask, bias=bias, dropout=dropout)
    assert chosen == want
    assert bool(why) == (want == "xla")  # a fallback says why, in one line


@pytest.mark.parametrize("requested,platform,dropout,message", [
    ("cudnn", "cpu", False, "cudnn' needs an NVIDIA GPU"),
    ("splash", "gpu", False, "splash' is the Pallas TPU kernel"),
    ("cudnn", "gpu", True, "cannot drop attention probabilities.*attention_dropout_rate=0"),
])
def test_an_explicit_backend_that_cannot_serve_stops_with_one_line(requested, platform, dropout, message):
    with pytest.raises(UserError, match=message) as e:
        choose(requested, platform=platform, dtype="bfloat16", head_dim=64, mask=PADDING, bias=False, dropout=dropout)
    assert "\n" not in str(e.value)


def test_unknown_backend_and_fused_recipes_with_attention_dropout_are_refused_in_the_config():
    from bertology.models.transformer import TransformerConfig

    with pytest.raises(UserError, match="attention_backend='flash' is unknown"):
        TransformerConfig(attention_backend="flash")
    with pytest.raises(UserError, match="cannot drop attention probabilities.*attention_dropout_rate=0"):
        TransformerConfig(attention_backend="splash", attention_dropout_rate=0.1)
    TransformerConfig(attention_backend="splash", attention_dropout_rate=0.0)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("kind", SEGMENT_KINDS)
def test_cudnn_matches_the_reference_in_bfloat16(kind):
    q, k, v, mask, visible, weights = case(kind, length=128)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    want = reference(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), visible, weights)
    got = run("cudnn", q, k, v, mask, weights)
    real = np.asarray(mask.keys)
    np.testing.assert_allclose(got[0][real], want[0][real], rtol=3e-2, atol=3e-2)
    for g, w in zip(got[1], want[1]):
        assert np.abs(g - w).max() <= 3e-2 * max(1.0, np.abs(w).max())


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("kind", ["padding", "causal"])
def test_cudnn_learns_a_score_bias_as_xla_does(kind):
    """T5's learned bucket bias ([1, heads, queries, keys], unscaled q·k): cuDNN in bfloat16
    against xla in float32, the output and the gradients of q, k, v and the bias."""
    q, k, v, mask, visible, weights = case(kind, length=128)
    q = q / np.sqrt(D)  # T5 folds the 1/sqrt(width) into its query weights: scores of order 1
    bias = jnp.asarray(np.random.default_rng(1).normal(size=(1, H, 128, 128)), jnp.float32)
    allowed, is_causal = mask.lower(None)
    fused = mask.fused(128, None)

    def go(backend, dtype):
        return output_and_grads(lambda q, k, v, b: attend(*(x.astype(dtype) for x in (q, k, v)), allowed=allowed,
                                                          is_causal=is_causal, bias=b.astype(dtype), scale=1.0,
                                                          backend=backend, fused=fused), weights, q, k, v, bias)

    got, want = go("cudnn", jnp.bfloat16), go("xla", jnp.float32)
    real = np.asarray(mask.keys)
    np.testing.assert_allclose(got[0][real], want[0][real], rtol=5e-2, atol=5e-2)
    for g, w in zip(got[1], want[1]):
        assert np.abs(g - w).max() <= 5e-2 * max(1.0, np.abs(w).max())
    assert np.abs(want[1][3]).max() > 0.1  # the bias does get a gradient


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["bert", "gpt"])
def test_a_tiny_model_trains_to_the_same_losses_on_splash_as_on_xla(recipe, tmp_path):
    """The whole run, not just one attention: BERT (padding, the MLM head's gathered rows) and
    GPT (packed causal rows) pretrain on the embedded corpus with dropout off, and every step's
    loss on splash (interpret mode) is xla's within 1e-4."""
    from helpers import short_run_config

    from bertology.train.loop import train

    runs = {}
    for backend in ("xla", "splash"):
        c = short_run_config(recipe, "tiny", total_steps=4, log_every=1, **{
            "model.attention_backend": backend, "model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0})
        out = train(c, tmp_path / backend)
        runs[backend] = np.array([row["loss"] for row in out["history"]])
    assert len(runs["xla"]) == 4
    np.testing.assert_allclose(runs["splash"], runs["xla"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["splash", "cudnn"])
def test_fine_tuning_from_a_checkpoint_runs_the_kernel_its_config_asks_for(backend, pretrained, tmp_path):
    """Fine-tuning takes the attention kernel and the dropout rates from its own config over the
    checkpoint's (`models.RUN_KEYS`): with the checkpoint's attention dropout (0.1) the fused kernel
    is refused in one line; at 0, every step's loss is xla's (dropout off: float32 within 1e-4 on
    splash in interpret mode; bfloat16 within 2e-2 on cuDNN, a GPU-only case)."""
    from bertology.train.finetune import finetune

    if backend == "cudnn" and jax.default_backend() != "gpu":
        pytest.skip("cuDNN attention needs an NVIDIA GPU")
    dtype, tolerance = ("bfloat16", 2e-2) if backend == "cudnn" else ("float32", 1e-4)

    def fine_tune(kernel, attention_dropout):
        c = helpers.tiny("embedded", init_checkpoint=str(pretrained), total_steps=3, eval_every=0, **{
            "model.attention_backend": kernel, "model.dtype": dtype, "model.dropout_rate": 0.0,
            "model.attention_dropout_rate": attention_dropout})
        finetune(c, tmp_path / kernel)
        rows = [json.loads(line) for line in (tmp_path / kernel / "metrics.jsonl").read_text().splitlines()]
        return np.array([r["loss"] for r in rows if "loss" in r])

    with pytest.raises(UserError, match=f"attention_backend='{backend}' cannot drop attention probabilities"):
        fine_tune(backend, None)  # unset: the checkpoint's 0.1
    assert not (tmp_path / backend).exists()  # refused before anything was written
    fused, xla = (fine_tune(kernel, 0.0) for kernel in (backend, "xla"))
    assert len(xla) == 3 and json.loads((tmp_path / backend / "config.json").read_text())["model"]["attention_backend"] == backend
    np.testing.assert_allclose(fused, xla, rtol=tolerance, atol=tolerance)
