"""Longformer (Beltagy et al. 2020, arXiv 2004.05150), end to end: a random Hugging Face
`LongformerForMaskedLM` (a window per layer, rows longer than the window and of lengths that are
no multiple of it, padding, with and without global tokens) imported and compared with
transformers, exported back and reloaded; the banded attention against the masked square and a
float64 reference, forward and gradient; the window and the global tokens doing what they say;
a RoBERTa long-ified into a Longformer computing what the RoBERTa did; the tiny config learning;
the presets' shapes against HF's released configs."""

import dataclasses
import functools
import os

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from bertology import models, validation
from bertology.errors import UserError
from bertology.interop import export_hf, hf_config, import_hf, names, records
from bertology.models.attention import banded
from bertology.train.checkpoint import load_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, L, V = 3, 38, 97
LENGTHS = (38, 29, 11)
TOLERANCE = 1e-4  # float32 parity, as tests/test_interop.py
# 2 layers, windows of 8 and 4 (4 and 2 keys each side) over rows of up to 38 tokens (no multiple of
# either); HF pads rows to a multiple of the widest window, which the others must divide
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, attention_window=[8, 4], type_vocab_size=1, pad_token_id=1,
             bos_token_id=0, eos_token_id=2, sep_token_id=2, layer_norm_eps=1e-5)
GLOBALS = ((0, 17), (0,), ())  # each row's global positions (row 2 none)


def load_config(preset):
    return helpers.config("longformer", preset)


def build_hf(seed=0):
    """A random HF LongformerForMaskedLM (float32): every tensor drawn from N(0, 0.2), so a
    swapped, missed or misplaced tensor shows (the global projections unlike the local ones)."""
    torch.manual_seed(seed)
    model = transformers.LongformerForMaskedLM._from_config(transformers.LongformerConfig(**SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def make_batch(with_globals):
    rng = np.random.default_rng(0)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, V, (B, L)), 1).astype(np.int32)
    batch = dict(input_ids=ids, input_mask=mask, masked_positions=np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)))
    if with_globals:
        flags = np.zeros((B, L), np.int32)
        for row, where in enumerate(GLOBALS):
            flags[row, list(where)] = 1
        batch["global_attention_mask"] = flags
    return batch


hf_outputs = functools.partial(helpers.hf_outputs, inputs=("input_ids", "input_mask", "global_attention_mask"))


@functools.cache
def _runner(cfg):
    """One jitted pass of the model under `cfg`: every layer's output and the MLM logits everywhere."""
    model = models.family("longformer").model(cfg)

    def run(m, batch):
        out = m.encoder(batch)
        return out["layers"], m.mlm(out["sequence"], m.encoder.attend)

    return jax.jit(lambda p, b: model.apply({"params": p}, b, method=run))


def our_outputs(params, block, batch, cfg=None):
    """Every hidden state (the trunk as fine-tuning builds it: `encoder`) and the MLM logits at
    every position; `cfg`: the same parameters under another config."""
    layers, logits = _runner(cfg or models.encoder_config(block))(params, batch)
    return {k: np.asarray(v) for k, v in {**{f"hidden_{i}": h for i, h in enumerate(layers)}, "mlm": logits}.items()}


# --- import matches transformers; export reloads in transformers ---------------------------------------

def test_import_matches_transformers_and_round_trips(tmp_path):
    hf = build_hf()
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type) == ("longformer", "longformer")
    assert report.fresh == [] and report.unused == []
    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert (block["attention_window"], block["position_offset"], block["type_vocab_size"]) == ([8, 4], 2, 1)
    flat = set(flatten_dict(params))
    rows = names.tensors(records.registry()["longformer"].layout, flat)
    assert {r.ours for r in rows} == flat, "every parameter has a row in the name map"

    for with_globals in (False, True):
        batch = make_batch(with_globals)
        reference = hf_outputs(hf, batch)
        diffs = helpers.max_diff(our_outputs(params, block, batch), reference, batch["input_mask"])
        print(f"\nlongformer max abs diff vs transformers ({'with' if with_globals else 'no'} globals): "
              f"{max(diffs.values()):.2e} ({len(diffs)} outputs; mlm {diffs['mlm']:.2e}; "
              f"logits scale {np.abs(reference['mlm']).max():.1f})")
        assert len(diffs) == SMALL["num_hidden_layers"] + 2
        assert max(diffs.values()) <= TOLERANCE, diffs

    # The test tells the settings apart: the same tensors with a wider window, no global tokens,
    # or the local projections in place of the global ones are off.
    batch = make_batch(True)
    reference = hf_outputs(hf, batch)
    cfg = models.encoder_config(block)
    enc = params["encoder"]
    local_for_global = {**params, "encoder": {**enc, **{f"attention_{i}": {
        **enc[f"attention_{i}"], **{f"{n}_global": enc[f"attention_{i}"][n] for n in ("query", "key", "value")}}
        for i in range(2)}}}
    no_globals = {k: v for k, v in batch.items() if k != "global_attention_mask"}
    for name, wrong_cfg, wrong_params, wrong_batch in (
            ("window one wider", dataclasses.replace(cfg, attention_window=(10, 6)), params, batch),
            ("no global tokens", cfg, params, no_globals),
            ("local projections for the global ones", cfg, local_for_global, batch)):
        wrong = helpers.max_diff(our_outputs(wrong_params, block, wrong_batch, cfg=wrong_cfg), reference,
                                 batch["input_mask"])
        print(f"the same tensors, {name}: {max(wrong.values()):.2e}")
        assert max(wrong.values()) > 100 * TOLERANCE, (name, wrong)

    exported = export_hf(tmp_path / "run", tmp_path / "export")
    assert exported == [tmp_path / "export"]
    reloaded, info = transformers.LongformerForMaskedLM.from_pretrained(exported[0], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert reloaded.config.attention_window == [8, 4]
    round_trip = helpers.max_diff(hf_outputs(reloaded.eval(), batch), reference, batch["input_mask"])
    print(f"longformer round trip max abs diff: {max(round_trip.values()):.2e}")
    assert max(round_trip.values()) <= 1e-6, round_trip


# --- the banded attention ------------------------------------------------------------------------------

def dense_reference(q, k, v, visible, extra=None):
    """float64 softmax(q·k / sqrt(d)) over the visible keys (and `extra` keys), times v."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(visible[:, None], s, -1e300)
    vals = v
    if extra is not None:
        gk, gv, g_ok = (np.asarray(x, np.float64) if i < 2 else np.asarray(x) for i, x in enumerate(extra))
        gs = np.einsum("bqhd,bghd->bhqg", q, gk) / np.sqrt(q.shape[-1])
        s = np.concatenate([s, np.where(g_ok[:, None], gs, -1e300)], -1)
        vals = np.concatenate([v, gv], 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, vals)


# a causal window and padding alone: tests/test_attention_backends.py's conformance suite
@pytest.mark.parametrize("length, window, causal", [(37, 4, False), (13, 20, False)])
def test_banded_equals_the_masked_square(length, window, causal):
    """`banded` against the float64 reference and against the dense masked path
    (`jax.nn.dot_product_attention`), forward and gradient, with padding and packed documents, at
    lengths that are no multiple of the window (and a window wider than the row); and it never
    builds a [length, length] array."""
    rng = np.random.default_rng(length)
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, 3, 8)), jnp.float32) for _ in range(3))
    real = np.arange(length)[None] < np.array([length, length - 6])[:, None]
    docs = np.where(np.arange(length) < length // 2, 1, 2)[None].repeat(2, 0)
    seg = np.where(real, docs, 0)
    pos = np.arange(length)
    visible = (seg[:, :, None] == seg[:, None, :]) & real[:, None, :] & (np.abs(pos[:, None] - pos[None]) <= window)
    if causal:
        visible &= pos[None, :] <= pos[:, None]
    weights = jnp.asarray(rng.normal(size=q.shape) * real[:, :, None, None], jnp.float32)

    def ours(q, k, v):
        out = banded(q, k, v, window=window, query_segments=jnp.asarray(docs), key_segments=jnp.asarray(seg),
                     causal=causal)
        return jnp.sum(out * weights), out

    def dense(q, k, v):
        out = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(visible)[:, None])
        return jnp.sum(out * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    (_, want), want_grads = jax.jit(jax.value_and_grad(dense, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(out)[real], dense_reference(q, k, v, visible)[real], atol=2e-5)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(want)[real], atol=2e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5)
    shapes = [var.aval.shape for eqn in jax.make_jaxpr(ours)(q, k, v).jaxpr.eqns for var in eqn.outvars]
    if 3 * window < length:
        assert not any(sum(n >= length for n in shape) >= 2 for shape in shapes), "a square was built"


def test_banded_extra_keys_join_the_softmax():
    """The extra (global) keys are in every query's softmax beside its band, where allowed."""
    rng = np.random.default_rng(1)
    length, window = 21, 3
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, 2, 8)), jnp.float32) for _ in range(3))
    gk, gv = (jnp.asarray(rng.normal(size=(2, 2, 2, 8)), jnp.float32) for _ in range(2))
    g_ok = np.ones((2, length, 2), bool)
    g_ok[1, :, 1] = False
    seg = np.ones((2, length), np.int32)
    pos = np.arange(length)
    visible = np.broadcast_to(np.abs(pos[:, None] - pos[None]) <= window, (2, length, length))
    out = jax.jit(lambda q, k, v, gk, gv: banded(q, k, v, window=window, query_segments=seg, key_segments=seg,
                                                 extra=(gk, gv, jnp.asarray(g_ok))))(q, k, v, gk, gv)
    np.testing.assert_allclose(np.asarray(out), dense_reference(q, k, v, visible, (gk, gv, g_ok)), atol=2e-5)


# --- the window and the global tokens --------------------------------------------------------------------

def test_a_token_reaches_its_window_and_globals_reach_everything():
    """Changing the token at 20 changes a one-layer stack's outputs exactly within 4 positions of
    it (window 8), plus at a global position (which attends to everything); a global token at 20
    is seen by every position."""
    c = load_config("tiny")
    c.model.update(vocab_size=50, num_layers=1, attention_window=[8], dropout_rate=0.0, attention_dropout_rate=0.0)
    enc = models.family("longformer").task_trunk(models.encoder_config(c.model), "encoder")
    ids = np.random.default_rng(0).integers(5, 50, (1, 40)).astype(np.int32)
    other = ids.copy()
    other[0, 20] = (ids[0, 20] + 1) % 50
    batch = lambda ids, flags: dict(input_ids=ids, input_mask=np.ones_like(ids), global_attention_mask=flags)  # noqa: E731
    none = np.zeros_like(ids)
    params = jax.jit(enc.init)(jax.random.key(0), batch(ids, none))
    run = jax.jit(lambda b: enc.apply(params, b)["layers"][1])
    for global_at in (None, 20, 5):
        flags = none.copy()
        if global_at is not None:
            flags[0, global_at] = 1
        changed = np.abs(np.asarray(run(batch(ids, flags)) - run(batch(other, flags)))).max(-1)[0] > 0
        expect = np.abs(np.arange(40) - 20) <= 4
        if global_at == 20:
            expect[:] = True
        elif global_at is not None:
            expect[global_at] = True
        np.testing.assert_array_equal(changed, expect, err_msg=f"global at {global_at}")


def test_config_refuses_odd_windows_and_other_settings():
    c = load_config("tiny")
    c.model.vocab_size = 50
    for key, value, match in (("attention_window", [7], "even"), ("attention_window", [8, 8, 8], "entries"),
                              ("positions", "rotary", "not read by Longformer")):
        block = c.model.to_dict()
        block[key] = value
        with pytest.raises(UserError, match=match):
            models.build(block)


# --- long-ification -----------------------------------------------------------------------------------------

def test_a_longified_roberta_computes_what_the_roberta_did(tmp_path):
    """Beltagy et al. §5: a tiny RoBERTa turned into a Longformer (positions copied out to 4x, the
    global projections copied from the local ones) gives the RoBERTa's logits on rows shorter than
    the window, without global tokens; its position table repeats the RoBERTa's. From a
    fine-tuning run, the task's head and name come along (the long-range curriculum's start)."""
    from bertology.families.longformer import longify

    roberta, params, batch, head = helpers.roberta_fine_tuning_run(tmp_path / "roberta")
    assert longify.main(["--from", str(tmp_path / "roberta"), "--to", str(tmp_path / "long"), "--positions", "64",
                         "--window", "32"]) == 0
    long_params, long_config = load_params(tmp_path / "long")
    block = long_config["model"]
    assert (block["family"], block["max_position_embeddings"], block["attention_window"]) == ("longformer", 66, [32])
    assert long_config["task"] == "sst2"
    np.testing.assert_array_equal(long_params["head"]["kernel"], head["kernel"])
    table = long_params["encoder"]["embeddings"]["position"]["embedding"]
    old = params["encoder"]["embeddings"]["position"]["embedding"]
    np.testing.assert_array_equal(table[2:], np.tile(old[2:], (4, 1)))
    a = np.asarray(jax.jit(roberta.apply)({"params": params}, batch)["mlm_logits"])
    b = np.asarray(jax.jit(models.build(block).apply)({"params": long_params}, batch)["mlm_logits"])
    real = batch["input_mask"].astype(bool)
    print(f"\nlongified roberta max abs diff: {np.abs(a - b)[real].max():.2e}")
    np.testing.assert_allclose(b[real], a[real], atol=1e-5)


# --- the tiny config learns -------------------------------------------------------------------------------------

def test_tiny_learns(tmp_path):
    """30 steps of the tiny preset's MLM on the embedded corpus (a window narrower than the row): the loss falls."""
    from bertology.train.loop import train

    c = helpers.short_run_config("longformer", "tiny", total_steps=30, log_every=1,
                                 **{"model.attention_window": [8]})
    assert max(c.model.attention_window) < c.data.max_seq_length
    mlm = np.array([h["mlm_loss"] for h in train(c, tmp_path / "run")["history"]])
    print(f"\nlongformer tiny mlm loss: first 5 {mlm[:5].mean():.3f}, last 5 {mlm[-5:].mean():.3f}")
    assert len(mlm) == 30
    assert mlm[-5:].mean() < mlm[:5].mean() - 0.75, mlm


# --- presets ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["tiny", "base", "large"])
def test_presets_pass_validation(preset):
    c = load_config(preset)
    c.model.vocab_size = c.model.vocab_size or 8192
    validation.check(c)


@pytest.mark.parametrize("preset, hf_overrides", [
    # allenai/longformer-base-4096's and -large-4096's config.json
    ("base", dict(vocab_size=50265, max_position_embeddings=4098, type_vocab_size=1, layer_norm_eps=1e-5,
                  attention_window=[512] * 12)),
    ("large", dict(vocab_size=50265, max_position_embeddings=4098, type_vocab_size=1, layer_norm_eps=1e-5,
                   attention_window=[512] * 24, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=4096)),
])
def test_released_presets_are_hf_shapes(preset, hf_overrides):
    """The base and large presets build HF's network, tensor for tensor (on torch's meta device),
    and export to that config."""
    c = load_config(preset)
    batch = {"input_ids": np.zeros((1, 4), np.int32), "masked_positions": np.zeros((1, 4), np.int32),
             "input_mask": np.ones((1, 4), np.int32)}
    params = jax.eval_shape(lambda: nn.meta.unbox(models.build(c.model).init(jax.random.key(0), batch)))["params"]
    ours = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    ours -= sum(np.prod(x.shape) for x in jax.tree.leaves(params["encoder"]["pooler"]))  # fine-tuning's; not an MLM's
    with torch.device("meta"):
        hf = transformers.LongformerForMaskedLM(transformers.LongformerConfig(**hf_overrides))
    assert ours == sum(p.numel() for p in hf.parameters())
    print(f"\nlongformer {preset}: {ours / 1e6:.1f}M parameters")
    block = c.model.to_dict()
    record = records.for_run(block)
    assert record.model_type == "longformer"
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    assert {k: exported[k] for k in hf_overrides} == hf_overrides


def test_flops_per_token_counts_the_band_not_the_row():
    """RoBERTa's count with the scores and context over the 3 · window // 2 keys the banded blocks
    hold (capped at the row), not over the whole row."""
    c = load_config("tiny")
    c.model.vocab_size = v = 8000
    n, h, s, p = 2, 128, 128, 20  # layers, width, row, predictions (the tiny recipe)
    assert (c.model.num_layers, c.model.hidden_size, c.data.max_seq_length, c.data.max_predictions_per_seq) == (
        n, h, s, p)
    keys = 3 * 16  # window 32: 16 keys each side, blocks of 16
    per_token = n * (2 * 2 * h * h + 2 * 2 * h * h + 2 * h * 4 * h * 2 + 2 * 2 * keys * h)
    mlm = (2 * h * h + 2 * h * v) * p / s
    assert models.flops_per_token(c) == pytest.approx(3 * (per_token + mlm), rel=1e-12)


# --- fine-tuning puts global attention where Hugging Face's task models do ------------------------------

def _task_rows(kind):
    """Rows in RoBERTa's layout, <s> 0 and </s> 2: QA rows as `<s> question </s></s> context </s>`
    (HF's `_get_question_end_index` wants three separators), the question 5, 9 and 3 tokens long."""
    batch = make_batch(False)
    ids = batch["input_ids"].copy()
    ids[:, 0] = 0
    for row, (question, length) in enumerate(zip((5, 9, 3), LENGTHS)):
        if kind == "qa":
            ids[row, [question + 1, question + 2, length - 1]] = 2
    return {"input_ids": ids, "input_mask": batch["input_mask"], "segment_ids": np.zeros_like(ids),
            "masked_positions": batch["masked_positions"]}


def test_fine_tuning_rows_get_hf_task_models_global_attention(tmp_path):
    """With no `global_attention_mask`, `task_inputs` flags [CLS] for a sequence-level head and
    [CLS] + the question for QA, and the trunk then computes what HF's
    `LongformerForSequenceClassification` / `LongformerForQuestionAnswering` do with theirs left out
    (their `global_attention_mask[:, 0] = 1`, `_compute_global_attention_mask`); tagging gets none."""
    from types import SimpleNamespace

    hf = build_hf()
    hf.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "run")
    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    cfg = models.encoder_config(block)
    family = models.family("longformer")
    tokenizer = SimpleNamespace(cls_id=0, sep_id=2)
    heads = {"classification": transformers.LongformerForSequenceClassification,
             "qa": transformers.LongformerForQuestionAnswering}
    for kind, head in heads.items():
        rows = _task_rows(kind)
        batch = family.task_inputs(cfg, tokenizer, rows, kind)
        expect = np.zeros_like(rows["input_ids"])
        for row, question in enumerate((5, 9, 3)):
            expect[row, :question + 1 if kind == "qa" else 1] = 1
        np.testing.assert_array_equal(batch["global_attention_mask"], expect, err_msg=kind)
        torch.manual_seed(0)
        task_model = head._from_config(transformers.LongformerConfig(**SMALL)).eval()
        task_model.longformer.load_state_dict(hf.longformer.state_dict(), strict=False)  # no pooler in the task models
        with torch.no_grad():
            o = task_model(input_ids=torch.tensor(rows["input_ids"], dtype=torch.long),
                           attention_mask=torch.tensor(rows["input_mask"], dtype=torch.long), output_hidden_states=True)
        reference = {f"hidden_{i}": h.numpy() for i, h in enumerate(o.hidden_states)}
        ours = {k: v for k, v in our_outputs(params, block, batch).items() if k != "mlm"}
        diffs = helpers.max_diff(ours, reference, rows["input_mask"])
        assert max(diffs.values()) <= TOLERANCE, (kind, diffs)
    assert "global_attention_mask" not in family.task_inputs(cfg, tokenizer, _task_rows("token"), "token")
    given = {**_task_rows("qa"), "global_attention_mask": np.ones((B, L), np.int32)}
    assert family.task_inputs(cfg, tokenizer, given, "qa")["global_attention_mask"] is given["global_attention_mask"]
    with pytest.raises(UserError, match="max_global_tokens"):  # a question longer than the slots is refused, not cut
        family.task_inputs(dataclasses.replace(cfg, max_global_tokens=4), tokenizer, _task_rows("qa"), "qa")


def test_a_classification_fine_tune_reads_the_whole_row_through_cls(tmp_path):
    """The fine-tuning job of a tiny Longformer on the long-range task: its rows flag [CLS] alone,
    and its logits move when a token far beyond the layers' windows changes; the same network with
    the window only (the mask zeroed) does not see that token."""
    from bertology import sweep, tasks
    from bertology.train import finetune

    c = sweep.load_config(helpers.REPO / "configs" / "finetune" / "long_range.py", "longformer_4096")
    c.data.update(long_range_tokens=128, long_range_prefix=32, long_range_train=4, long_range_eval=2,
                  max_seq_length=128, cache_dir=str(tmp_path))
    c.model.update(num_layers=1, attention_window=[8], max_position_embeddings=130)
    job = finetune.encoder_job(c, tasks.get("long_range"))
    example = {k: np.asarray(v) for k, v in job.example.items()}
    flags = example["global_attention_mask"]
    assert flags.shape == (1, 128) and flags[0, 0] == 1 and flags.sum() == 1
    assert example["input_mask"][0, 100] == 1
    far = example["input_ids"].copy()
    far[0, 100] = (far[0, 100] + 7) % job.model.cfg.vocab_size  # one layer's window reaches 4 positions
    params = jax.jit(job.model.init)(jax.random.key(0), example)
    logits = jax.jit(lambda b: job.model.apply(params, b)["logits"])
    window_only = np.zeros_like(flags)
    assert not np.allclose(logits(example), logits({**example, "input_ids": far}))
    np.testing.assert_array_equal(logits({**example, "global_attention_mask": window_only}),
                                  logits({**example, "global_attention_mask": window_only, "input_ids": far}))
