"""The BERT family as configs: each objective against numpy, ALBERT's sizes and sharing,
ELECTRA's sampling rules, the instance builders, and every tiny config learning on 1 and 8 devices."""

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import np_gelu, np_layer_norm
from scipy.special import log_softmax

from bertology import models, objectives
from bertology.data.examples import create_full_sentence_instances, create_pair_instances
from bertology.families.electra import model as electra
from bertology.families.electra.objective import replace_with_samples, rtd_loss
from bertology.models.heads import SpanBoundaryHead
from bertology.models.transformer import TransformerConfig

FAMILIES = ["bert", "roberta", "albert", "electra", "spanbert"]


def _bce(logits, labels):
    return np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))


# --- objectives against numpy -------------------------------------------------------------------

def test_sop_loss_is_the_pair_classifier_loss_on_swapped_labels():
    cfg = helpers.config("albert", "tiny")
    cfg.model.vocab_size = 50
    model = models.build(cfg.model)
    rng = np.random.default_rng(0)
    batch = dict(input_ids=rng.integers(5, 50, (4, 12)).astype(np.int32), input_mask=np.ones((4, 12), np.int32),
                 segment_ids=np.zeros((4, 12), np.int32), masked_positions=np.tile(np.arange(1, 4), (4, 1)).astype(np.int32),
                 masked_ids=rng.integers(5, 50, (4, 3)).astype(np.int32), masked_weights=np.ones((4, 3), np.float32),
                 next_sentence_label=np.array([0, 1, 1, 0], np.int32))
    params = model.init(jax.random.key(0), batch)["params"]
    total, m = objectives.get("albert")(params, batch, None, model)
    out = model.apply({"params": params}, batch)
    sop = -log_softmax(np.asarray(out["sop_logits"], np.float64), -1)[np.arange(4), batch["next_sentence_label"]].mean()
    mlm = -np.take_along_axis(log_softmax(np.asarray(out["mlm_logits"], np.float64), -1), batch["masked_ids"][..., None], -1).mean()
    np.testing.assert_allclose(m["sop_loss"], sop, rtol=1e-5)
    np.testing.assert_allclose(total, mlm * 3 / (3 + 1e-5 / 4) + sop, rtol=1e-5)


def test_rtd_loss_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 10)) * 2
    replaced = rng.random((3, 10)) < 0.3
    w = (rng.random((3, 10)) < 0.8).astype(np.int32)
    loss, m = rtd_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(replaced), jnp.asarray(w))
    ref = (_bce(logits, replaced) * w).sum() / (w.sum() + 1e-5)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(m["disc_accuracy"], (((logits > 0) == replaced) * w).sum() / (w.sum() + 1e-5), rtol=1e-5)


def test_span_boundary_head_matches_numpy():
    cfg = TransformerConfig(vocab_size=30, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
    rng = np.random.default_rng(0)
    seq = rng.normal(size=(2, 12, 8)).astype(np.float32)
    positions = np.array([[3, 4, 5, 9], [1, 2, 7, 8]], np.int32)
    start = np.array([[3, 3, 3, 9], [1, 1, 7, 7]], np.int32)
    end = np.array([[6, 6, 6, 10], [3, 3, 9, 9]], np.int32)
    table = rng.normal(size=(30, 8)).astype(np.float32)
    head = SpanBoundaryHead(cfg, max_span_positions=16)
    attend = lambda h: h @ jnp.asarray(table).T  # noqa: E731
    left, right = (np.take_along_axis(seq, i[..., None], 1) for i in SpanBoundaryHead.boundaries(start, end, 12))
    params = nn.meta.unbox(head.init(jax.random.key(1), left, right, positions, start, attend)["params"])
    got = head.apply({"params": params}, left, right, positions, start, attend)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    rows = np.arange(2)[:, None]
    h = np.concatenate([seq[rows, start - 1], seq[rows, end], p["position"]["embedding"][positions - start]], -1)
    for i in range(2):
        h = np_layer_norm(np_gelu(h @ p[f"dense_{i}"]["kernel"] + p[f"dense_{i}"]["bias"]), p[f"norm_{i}"])
    np.testing.assert_allclose(got, h @ table.T + p["bias"], atol=1e-4)


def _electra_setup(head="rtd", seed=0):
    cfg = TransformerConfig(vocab_size=40, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                        embedding_size=16, pooler=False)
    model = electra.Model(cfg, electra.generator_config(cfg, 0.5), head)
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 40, (4, 10)).astype(np.int32)
    pos = np.tile(np.array([2, 5, 7]), (4, 1)).astype(np.int32)
    batch = dict(input_ids=ids.copy(), input_mask=np.ones((4, 10), np.int32), masked_positions=pos,
                 masked_ids=ids[np.arange(4)[:, None], pos], masked_weights=np.ones((4, 3), np.float32))
    batch["input_ids"][np.arange(4)[:, None], pos] = 4  # [MASK]
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), batch)["params"])
    return model, params, batch


def test_electra_sample_equal_to_original_is_labelled_original():
    _, _, batch = _electra_setup()
    onehot = jax.nn.one_hot(batch["masked_ids"], 40) * 1e4  # the generator is sure of the original
    corrupted, original, replaced = replace_with_samples(batch, onehot, jax.random.key(0))
    np.testing.assert_array_equal(corrupted, original)
    assert not np.asarray(replaced).any()
    other = jax.nn.one_hot((batch["masked_ids"] + 1) % 40, 40) * 1e4  # sure of something else
    corrupted, original, replaced = replace_with_samples(batch, other, jax.random.key(0))
    expect = np.zeros((4, 10), bool)
    expect[np.arange(4)[:, None], batch["masked_positions"]] = True
    np.testing.assert_array_equal(replaced, expect)


@pytest.mark.parametrize("variant", ["electra", "electra_15"])
def test_electra_loss_matches_numpy(variant):
    model, params, batch = _electra_setup()
    total, m = objectives.get({"name": "electra", "variant": variant})(params, batch, None, model)
    key = jax.random.split(jax.random.key(0), 3)[0]
    gen = np.asarray(model.apply({"params": params}, batch, method="generate"), np.float64)
    corrupted, _, replaced = replace_with_samples(batch, jnp.asarray(gen, jnp.float32), key)
    disc = np.asarray(model.apply({"params": params}, {**batch, "input_ids": corrupted}, method="discriminate"), np.float64)
    w = np.ones((4, 10))
    if variant == "electra_15":
        w = np.zeros((4, 10))
        w[np.arange(4)[:, None], batch["masked_positions"]] = 1
    mlm = -np.take_along_axis(log_softmax(gen, -1), batch["masked_ids"][..., None], -1).sum() / (12 + 1e-5)
    d = (_bce(disc, np.asarray(replaced)) * w).sum() / (w.sum() + 1e-5)
    np.testing.assert_allclose(m["disc_loss"], d, rtol=1e-5)
    np.testing.assert_allclose(total, mlm + 50 * d, rtol=1e-5)


@pytest.mark.parametrize("variant", ["replace_mlm", "all_tokens_mlm"])
def test_electra_mlm_ablations_match_numpy(variant):
    model, params, batch = _electra_setup(head="mlm")
    _, m = objectives.get({"name": "electra", "variant": variant})(params, batch, None, model)
    key = jax.random.split(jax.random.key(0), 3)[0]
    gen = model.apply({"params": params}, batch, method="generate")
    corrupted, original, _ = replace_with_samples(batch, gen, key)
    if variant == "replace_mlm":
        positions, targets = batch["masked_positions"], batch["masked_ids"]
    else:
        positions, targets = np.tile(np.arange(10), (4, 1)), np.asarray(original)
    logits = np.asarray(model.apply({"params": params}, {**batch, "input_ids": corrupted}, positions=positions,
                                    method="discriminate"), np.float64)
    ref = -np.take_along_axis(log_softmax(logits, -1), targets[..., None], -1).mean()
    np.testing.assert_allclose(m["disc_loss"], ref, rtol=1e-4)


@pytest.mark.slow
def test_discriminator_loss_sends_no_gradient_into_the_generator():
    model, params, batch = _electra_setup()
    loss = objectives.get("electra")

    def disc_part(p):  # total minus the generator's own MLM loss
        total, m = loss(p, batch, jax.random.key(3), model)
        return total - m["mlm_loss"]

    grads = jax.jit(jax.grad(disc_part))(params)  # jitted: op by op, the gradient took ~40 s to dispatch
    for leaf in jax.tree.leaves(grads["generator"]):
        np.testing.assert_array_equal(leaf, 0.0)
    shared = grads["discriminator"]["encoder"]["embeddings"]["token"]["embedding"]
    assert np.abs(shared).sum() > 0  # the discriminator does train the shared table


# --- ALBERT -------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset, paper_millions, tolerance", [
    ("base", 12, 0.05), ("large", 18, 0.05), ("xlarge", 60, 0.05),
    # The paper says 235M; google-research/albert's xxlarge config (H4096, FF16384, 64 heads,
    # E128, 30k vocab) has 223M, 5.04% fewer. We match the reference code; see the issue note.
    ("xxlarge", 235, 0.051),
])
def test_albert_parameter_counts(preset, paper_millions, tolerance):
    cfg = helpers.config("albert", preset)
    cfg.model.vocab_size = 30000
    model = models.build(cfg.model)
    batch = dict(input_ids=jnp.ones((1, 8), jnp.int32), input_mask=jnp.ones((1, 8), jnp.int32),
                 segment_ids=jnp.zeros((1, 8), jnp.int32), masked_positions=jnp.zeros((1, 2), jnp.int32))
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))["params"]
    count = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert abs(count / 1e6 - paper_millions) / paper_millions <= tolerance, count


@pytest.mark.slow
def test_shared_layers_are_one_set_and_their_gradients_are_summed():
    base = dict(vocab_size=30, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32, dropout_rate=0.0,
                attention_dropout_rate=0.0)
    shared = models.build(ml_collections.ConfigDict(dict(family="roberta", share_layers="all", **base)))
    unshared = models.build(ml_collections.ConfigDict(dict(family="roberta", **base)))
    rng = np.random.default_rng(0)
    batch = dict(input_ids=rng.integers(5, 30, (2, 6)).astype(np.int32), input_mask=np.ones((2, 6), np.int32),
                 masked_positions=np.array([[1, 2], [3, 4]], np.int32), masked_ids=rng.integers(5, 30, (2, 2)).astype(np.int32),
                 masked_weights=np.ones((2, 2), np.float32))
    p_shared = nn.meta.unbox(jax.jit(shared.init)(jax.random.key(0), batch)["params"])
    assert {k for k in p_shared["encoder"] if k.startswith(("attention", "ffn"))} == {"attention_0", "ffn_0"}
    # The unshared model with every layer a copy of the shared one computes the same function ...
    p_unshared = {**p_shared, "encoder": dict(p_shared["encoder"])}
    for i in range(3):
        p_unshared["encoder"][f"attention_{i}"] = p_shared["encoder"]["attention_0"]
        p_unshared["encoder"][f"ffn_{i}"] = p_shared["encoder"]["ffn_0"]
    loss = objectives.get("roberta")
    g_shared = jax.jit(jax.grad(lambda p: loss(p, batch, None, shared)[0]))(p_shared)
    g_unshared = jax.jit(jax.grad(lambda p: loss(p, batch, None, unshared)[0]))(p_unshared)
    # ... and the shared set's gradient is the sum of the copies' gradients.
    for block in ("attention", "ffn"):
        summed = jax.tree.map(lambda *g: sum(g), *[g_unshared["encoder"][f"{block}_{i}"] for i in range(3)])
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_shared["encoder"][f"{block}_0"], summed)


@pytest.mark.parametrize("sharing, attn, ffn", [("attention", 1, 3), ("ffn", 3, 1), ("none", 3, 3)])
def test_partial_sharing(sharing, attn, ffn):
    model = models.build(ml_collections.ConfigDict(dict(family="roberta", vocab_size=30, hidden_size=16, num_layers=3,
                                                         num_heads=2, intermediate_size=32, share_layers=sharing)))
    batch = dict(input_ids=jnp.ones((1, 4), jnp.int32), input_mask=jnp.ones((1, 4), jnp.int32),
                 masked_positions=jnp.zeros((1, 1), jnp.int32))
    enc = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))["params"]["encoder"]
    assert sum(k.startswith("attention_") for k in enc) == attn and sum(k.startswith("ffn_") for k in enc) == ffn


# --- instance builders --------------------------------------------------------------------------

def test_sop_pairs_are_consecutive_segments_swapped_for_negatives():
    rng = np.random.default_rng(0)
    counter = iter(range(10**6))
    docs = [[np.array([next(counter) + 10 for _ in range(rng.integers(3, 8))], np.int32) for _ in range(6)] for _ in range(40)]
    inst = create_pair_instances(docs, max_seq_length=64, short_seq_prob=0.0, cls_id=2, sep_id=3, rng=rng,
                                 swap_for_negative=True)
    labels = inst.next_sentence_label
    assert 0.4 < labels.mean() < 0.6
    np.testing.assert_array_equal(inst.doc_a, inst.doc_b)  # never another document
    for ids, seg, label in zip(inst.input_ids, inst.segment_ids, labels):
        a, b = ids[(seg == 0) & (ids > 3)], ids[(seg == 1) & (ids > 3)]
        # tokens are consecutive integers in text order: A precedes B unless swapped
        assert (a.max() < b.min()) == (label == 0)


def test_full_sentence_rows_pack_whole_sentences_across_documents():
    docs = [[np.arange(10, 15, dtype=np.int32), np.arange(20, 24, dtype=np.int32)], [np.arange(30, 37, dtype=np.int32)],
            [np.arange(40, 80, dtype=np.int32)]]

    def rows(docs, length):
        out = create_full_sentence_instances(docs, max_seq_length=length, cls_id=2, sep_id=3, pad_id=0)
        assert (out["segment_ids"] == 0).all() and (out["input_ids"][out["input_mask"] == 0] == 0).all()
        return [r[m > 0].tolist() for r, m in zip(out["input_ids"], out["input_mask"])]

    got = rows(docs, 16)
    assert got[0] == [2, *range(10, 15), *range(20, 24), 3]  # doc 0 whole; doc 1 does not fit beside it
    assert got[1] == [2, *range(30, 37), 3]
    assert got[2] == [2, *range(40, 54), 3]  # a sentence longer than a row is cut into row-sized pieces
    assert all(len(r) <= 16 for r in rows(docs, 16))
    # With room, documents share a row with a separator between them.
    assert rows(docs[:2], 24) == [[2, *range(10, 15), *range(20, 24), 3, *range(30, 37), 3]]
    # DOC-SENTENCES (cross_documents=False): a document's end ends its row, even with room left
    doc_rows = create_full_sentence_instances(docs[:2], max_seq_length=24, cls_id=2, sep_id=3, pad_id=0,
                                              cross_documents=False)
    assert [r[m > 0].tolist() for r, m in zip(doc_rows["input_ids"], doc_rows["input_mask"])] == [
        [2, *range(10, 15), *range(20, 24), 3], [2, *range(30, 37), 3]]


# --- every family trains ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES[1:])
def test_tiny_family_learns_on_one_and_eight_devices(family, tmp_path):
    from bertology.train.loop import train

    runs = {}
    # One device learns for 50 steps; eight devices repeat its first 15 on the same schedule (the
    # step-by-step equality of the losses is what 1-vs-8 checks; more steps only cost time).
    for shape, steps in [((1, 1), 50), ((8, 1), 15)]:
        c = helpers.config(family, "tiny")
        c.batch_size, c.total_steps, c.log_every, c.eval_every, c.checkpoint_every = 8, steps, 1, 0, 1000
        c.optimizer.warmup_steps, c.optimizer.schedule_steps = 10, 50
        c.data.max_seq_length, c.data.max_predictions_per_seq = 64, 10
        c.mesh.shape = shape
        runs[shape] = [(h["loss"], h["mlm_loss"]) for h in train(c, tmp_path / str(shape))["history"]]
    one, eight = np.array(runs[(1, 1)]), np.array(runs[(8, 1)])
    mlm = one[:, 1]
    assert mlm[-10:].mean() < mlm[:5].mean() - 0.75, mlm  # nats: far beyond step-to-step noise
    assert len(eight) == 15
    np.testing.assert_allclose(eight, one[:15], rtol=2e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_read_the_same_states_as_from_the_full_last_layer(family, monkeypatch):
    """Each family hands the encoder the positions its heads read (`outputs_at`); its outputs must
    equal those of an encoder that runs the full last layer and gathers."""
    from bertology.models.transformer import Encoder, gather_positions

    c = helpers.config(family, "tiny")
    c.model.vocab_size = 50
    model = models.build(c.model)
    rng = np.random.default_rng(0)
    n, length = 4, 16
    positions = np.sort(np.stack([rng.choice(np.arange(1, 14), n, replace=False) for _ in range(3)]), 1)
    batch = dict(input_ids=rng.integers(5, 50, (3, length)).astype(np.int32), input_mask=np.ones((3, length), np.int32),
                 segment_ids=np.zeros((3, length), np.int32), masked_positions=positions.astype(np.int32),
                 span_start=(positions - rng.integers(0, 2, (3, n))).astype(np.int32),
                 span_end=(positions + rng.integers(1, 3, (3, n))).astype(np.int32))
    params = model.init(jax.random.key(0), batch)["params"]
    ours = model.apply({"params": params}, batch)
    full_call = Encoder.__call__

    def full_then_gather(self, *args, outputs_at=None, **kwargs):
        out = full_call(self, *args, **kwargs)
        return out if outputs_at is None else dict(out, sequence=gather_positions(out["sequence"], outputs_at))

    monkeypatch.setattr(Encoder, "__call__", full_then_gather)
    reference = model.apply({"params": params}, batch)
    assert set(ours) == set(reference)
    for name in ours:
        np.testing.assert_allclose(ours[name], reference[name], atol=1e-5, err_msg=name)
    if family == "spanbert":  # the head wiring itself, spelled out: MLM at the masked tokens, SBO at the boundaries

        def spelled_out(m, batch):
            seq = m.encoder({"input_ids": batch["input_ids"], "input_mask": batch["input_mask"]})["sequence"]
            left = gather_positions(seq, np.maximum(batch["span_start"] - 1, 0))
            right = gather_positions(seq, np.minimum(batch["span_end"], length - 1))
            return {"mlm_logits": m.mlm(gather_positions(seq, positions), m.encoder.attend),
                    "sbo_logits": m.sbo(left, right, positions, batch["span_start"], m.encoder.attend)}

        spelled = model.apply({"params": params}, batch, method=spelled_out)
        for name in ours:
            np.testing.assert_allclose(ours[name], spelled[name], atol=1e-5, err_msg=name)


def test_packed_instances_flow_through_the_stream():
    from bertology.data.embedded import DEFAULT_VOCAB
    from bertology.data.pipeline import PretrainingStream
    from bertology.data.tokenizers import load_tokenizer

    tok = load_tokenizer(DEFAULT_VOCAB)
    rng = np.random.default_rng(0)
    docs = [[rng.integers(10, 2000, rng.integers(3, 15)).astype(np.int32) for _ in range(rng.integers(1, 4))]
            for _ in range(60)]
    c = helpers.config("roberta", "tiny").data
    c.update(instances="packed", max_seq_length=64, vocab=None)
    batch = next(PretrainingStream([docs], tok, c, batch_size=16, seed=0))
    ids, pid, pos = batch["input_ids"], batch["packing_ids"], batch["positions"]
    assert (pid.max(1) >= 2).any()  # rows hold several documents
    for r in range(16):
        for k in range(1, pid[r].max() + 1):
            piece = np.flatnonzero(pid[r] == k)
            np.testing.assert_array_equal(pos[r, piece], np.arange(len(piece)))  # positions restart
            assert ids[r, piece[-1]] == tok.sep_id  # each document ends with its own [SEP]
    originals = batch["masked_ids"][batch["masked_weights"] > 0]
    assert len(originals) and not np.isin(originals, [tok.cls_id, tok.sep_id, tok.pad_id]).any()


@pytest.mark.parametrize("family", ["electra", "spanbert", "bert"])
def test_every_family_trains_on_packed_rows(family):
    """Packing is data: any family's model reads `packing_ids` from the batch (ELECTRA's two
    networks included), trains on packed rows, and the ids change what it computes."""
    from bertology import models, objectives
    from bertology.data.embedded import DEFAULT_VOCAB
    from bertology.data.pipeline import PretrainingStream
    from bertology.data.tokenizers import load_tokenizer

    tok = load_tokenizer(DEFAULT_VOCAB)
    rng = np.random.default_rng(0)
    docs = [[rng.integers(10, 2000, rng.integers(3, 15)).astype(np.int32) for _ in range(rng.integers(1, 4))]
            for _ in range(60)]
    c = helpers.config(family, "tiny")
    c.data.update(instances="packed", max_seq_length=64, masking="dynamic", vocab=None,
                  **({"mask_unit": "token"} if family == "spanbert" else {}))
    if family == "spanbert":
        c.data.mask_unit = "span"
    c.model.update(vocab_size=tok.vocab_size, dropout_rate=0.0, attention_dropout_rate=0.0)
    batch = next(PretrainingStream([docs], tok, c.data, batch_size=8, seed=0))
    assert (batch["packing_ids"].max(1) >= 2).any()
    if family == "bert":  # packed rows carry no sentence-pair label
        batch["next_sentence_label"] = np.zeros(8, np.int32)
    model = models.build(c.model)
    loss_fn = objectives.get(c.objective)
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    loss, grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, jax.random.key(1), model)[0]))(params)
    assert np.isfinite(loss) and all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    unpacked = {k: v for k, v in batch.items() if k != "packing_ids"}  # the documents now see each other
    evaluate = jax.jit(lambda b: loss_fn(params, b, None, model)[0])
    assert float(evaluate(batch)) != float(evaluate(unpacked))
