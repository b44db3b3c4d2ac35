"""BigBird (Zaheer et al. 2020, arXiv 2007.14062), end to end: a random Hugging Face
`BigBirdForMaskedLM` in block-sparse mode (rows long enough for the pattern, padding, a length
the block does not divide) imported and compared with transformers in evaluation mode, exported
back and reloaded; HF's full-attention modes (original_full, and a row too short for the
pattern); the block-sparse attention against a dense softmax over the same block mask, forward
and gradient; which key blocks each query block sees, against the paper's description; the
tiny config learning; the presets' shapes against HF's released configs."""

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
from bertology.models import block_sparse
from bertology.models.transformer import Attention, Encoder, Mask, TransformerConfig
from bertology.train.checkpoint import load_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V = 97
TOLERANCE = 1e-4  # float32 parity, as tests/test_interop.py
# blocks of 4 tokens, 2 random blocks: block-sparse above (5 + 2·2)·4 = 36 tokens
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=96, type_vocab_size=2, block_size=4, num_random_blocks=2,
             attention_type="block_sparse", hidden_act="gelu_new", pad_token_id=0)


def build_hf(seed=0, **overrides):
    """A random HF BigBirdForMaskedLM in evaluation mode: every tensor, LayerNorm scales and the
    decoder bias too, drawn from N(0, 0.2), so a swapped, missed or misplaced tensor shows."""
    model = transformers.BigBirdForMaskedLM._from_config(transformers.BigBirdConfig(**{**SMALL, **overrides}))
    torch.manual_seed(seed)  # after construction, whose own init draws differ across transformers versions
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def make_batch(length, lengths, seed=0):
    """Rows padded to `length` (real tokens first, segment 1 on the second half of each row); the
    MLM head read at every position."""
    rng = np.random.default_rng(seed)
    b = len(lengths)
    mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, V, (b, length)), 0).astype(np.int32)
    segments = ((np.arange(length)[None] >= np.array(lengths)[:, None] // 2) & (mask > 0)).astype(np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (b, length))
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments, masked_positions=positions)


hf_outputs = functools.partial(helpers.hf_outputs, inputs=("input_ids", "input_mask", "segment_ids"))


def our_outputs(params, cfg, batch):
    """Every hidden state (the trunk as fine-tuning builds it) and the MLM logits, in one jitted call."""
    record = models.family("bigbird")

    @jax.jit
    def run(params, batch):
        layers = Encoder(cfg).apply({"params": record.trunk(params)}, batch)["layers"]
        return {**{f"hidden_{i}": h for i, h in enumerate(layers)},
                "mlm": record.model(cfg).apply({"params": params}, batch)["mlm_logits"]}

    return {k: np.asarray(v) for k, v in run(params, batch).items()}


# --- import matches transformers; export reloads in transformers ---------------------------------------

def test_import_matches_transformers_and_round_trips(tmp_path, monkeypatch):
    hf = build_hf()
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.model_type) == ("bigbird", "big_bird")
    assert report.fresh == [] and report.unused == []
    params, run_config = load_params(tmp_path / "run")
    block = run_config["model"]
    assert {k: block[k] for k in ("sparse_block_size", "num_random_blocks", "activation", "scale_embeddings",
                                  "norm", "pooler")} == dict(sparse_block_size=4, num_random_blocks=2,
                                                             activation="gelu_tanh", scale_embeddings=False,
                                                             norm="post", pooler=True)
    flat = set(flatten_dict(params))
    rows = names.tensors(records.registry()["big_bird"].layout, flat)
    assert {r.ours for r in rows} == flat, "every parameter has a row in the name map"
    cfg = models.encoder_config(block)

    # 64 tokens = 16 blocks (block-sparse); rows of 64, 50 and 33 real tokens
    batch = make_batch(64, (64, 50, 33))
    assert not block_sparse.too_short(64, 4, 2)
    reference = hf_outputs(hf, batch)
    diffs = helpers.max_diff(our_outputs(params, cfg, batch), reference)
    print(f"\nbigbird block-sparse max abs diff vs transformers: {max(diffs.values()):.2e} ({len(diffs)} outputs; "
          f"mlm {diffs['mlm']:.2e}; logits scale {np.abs(reference['mlm']).max():.1f})")
    assert len(diffs) == SMALL["num_hidden_layers"] + 2
    assert max(diffs.values()) <= TOLERANCE, diffs

    # The test tells the pattern apart: the same tensors under block-sparse attention whose random
    # slots are the paper's legal draws instead of HF's evaluation table are off (and dense attention
    # farther still: `test_block_sparse_is_the_dense_softmax_over_its_mask`).
    drawn = block_sparse.draw_random_blocks(jax.random.key(3), 4, 16, 2)
    with monkeypatch.context() as patch:
        patch.setattr(block_sparse, "eval_random_blocks", lambda heads, n, r: drawn)
        legal = helpers.max_diff(our_outputs(params, cfg, batch), reference, batch["input_mask"])
    print(f"the same tensors, drawn random blocks: mlm {legal['mlm']:.2e}")
    assert legal["mlm"] > 100 * TOLERANCE, legal

    # A length the block does not divide: HF pads inside (and cuts the sequence output back)
    odd = make_batch(62, (62, 45), seed=1)
    odd_diffs = helpers.max_diff(our_outputs(params, cfg, odd), hf_outputs(hf, odd))
    print(f"bigbird 62 tokens (padded to 64 inside) max abs diff: {max(odd_diffs.values()):.2e}")
    assert max(odd_diffs.values()) <= TOLERANCE, odd_diffs

    exported = export_hf(tmp_path / "run", tmp_path / "export")
    assert exported == [tmp_path / "export"]
    reloaded, info = transformers.BigBirdForMaskedLM.from_pretrained(exported[0], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    shape = {k: v for k, v in SMALL.items() if k != "pad_token_id"}
    assert {k: getattr(reloaded.config, k) for k in shape} == shape  # the shape and pattern, as exported
    round_trip = helpers.max_diff(hf_outputs(reloaded.eval(), batch), reference)
    print(f"bigbird round trip max abs diff: {max(round_trip.values()):.2e}")
    assert max(round_trip.values()) <= 1e-6, round_trip

    # Too short for the pattern (32 <= 36 tokens): HF switches the model to full attention, and so do we.
    short = make_batch(32, (32, 20), seed=2)
    short_diffs = helpers.max_diff(our_outputs(params, cfg, short), hf_outputs(hf, short), short["input_mask"])
    print(f"bigbird 32 tokens (full attention) max abs diff: {max(short_diffs.values()):.2e}")
    assert hf.bert.attention_type == "original_full"  # HF's switch (it sticks to the model)
    assert max(short_diffs.values()) <= TOLERANCE, short_diffs


def test_original_full_imports_as_dense_attention(tmp_path):
    hf = build_hf(seed=1, attention_type="original_full")
    hf.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "run")
    params, run_config = load_params(tmp_path / "run")
    assert run_config["model"]["sparse_block_size"] is None
    batch = make_batch(48, (48, 30), seed=4)
    diffs = helpers.max_diff(our_outputs(params, models.encoder_config(run_config["model"]), batch), hf_outputs(hf, batch),
                             batch["input_mask"])
    print(f"\nbigbird original_full max abs diff: {max(diffs.values()):.2e}")
    assert max(diffs.values()) <= TOLERANCE, diffs
    exported = export_hf(tmp_path / "run", tmp_path / "export")
    assert transformers.BigBirdConfig.from_pretrained(exported[0]).attention_type == "original_full"


# --- the block-sparse attention ------------------------------------------------------------------------------

def dense_reference(q, k, v, keys, counts, block):
    """softmax over a dense [L, L] mask: query i weighs key j by counts[block(i), block(j)] (0: not
    seen; HF's evaluation table counts block 0 more than once) times exp(score), padding keys 0, a
    padded query's output 0. The same computation as `block_sparse.attend`, written densely."""
    length = q.shape[1]
    n = counts.shape[-1]
    full = jnp.repeat(jnp.repeat(counts.astype(jnp.float32), block, 1), block, 2)  # [heads, n·b, n·b]
    full = full[:, :length, :length]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
    weight = full[None] * keys[:, None, None, :]
    s = jnp.where(weight > 0, s + jnp.log(jnp.maximum(weight, 1e-30)), -jnp.inf)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    assert n * block >= length
    return jnp.where(keys[:, :, None, None], out, 0.0)


def test_block_sparse_is_the_dense_softmax_over_its_mask():
    """Forward and gradient equal the dense softmax over the same block mask, on a length the
    block does not divide (30 tokens, blocks of 4: 8 blocks) with a padded row, for a drawn table
    of random blocks and for HF's evaluation table (block 0 counted r + 1 times)."""
    b, length, heads, width, block, r = 2, 30, 2, 4, 4, 1
    n = -(-length // block)
    keys = jnp.asarray(np.arange(length)[None] < np.array([[30], [22]]))
    q, k, v = (jax.random.normal(jax.random.key(i), (b, length, heads, width)) for i in range(3))
    cot = jax.random.normal(jax.random.key(9), (b, length, heads, width))

    def both(f):
        """(output, gradient of <output, cot> in q, k, v), one compile for every table."""
        grad = jax.grad(lambda q, k, v, table: jnp.sum(f(q, k, v, table) * cot), argnums=(0, 1, 2))
        return jax.jit(lambda q, k, v, table: (f(q, k, v, table), grad(q, k, v, table)))

    sparse = both(lambda q, k, v, random: block_sparse.attend(q, k, v, keys, block=block, random=random))
    dense = both(lambda q, k, v, counts: dense_reference(q, k, v, keys, counts, block))
    for random in (block_sparse.draw_random_blocks(jax.random.key(7), heads, n, r),
                   block_sparse.eval_random_blocks(heads, n, r)):
        counts = block_sparse.pattern(random)
        (out, grads), (want, want_grads) = sparse(q, k, v, random), dense(q, k, v, jnp.asarray(counts))
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-5)
        for got, expect in zip(grads, want_grads):
            np.testing.assert_allclose(np.asarray(got), np.asarray(expect), atol=1e-5)
        # not a trivially equal pair: the dense softmax over every key differs
        everything, _ = dense(q, k, v, jnp.ones_like(jnp.asarray(counts)))
        assert float(jnp.abs(everything - out).max()) > 1e-2


@functools.partial(jax.jit, static_argnums=4)
def _probe(q, k, v, random, block):
    return block_sparse.attend(q, k, v, jnp.ones(q.shape[:2], bool), block=block, random=random)


def seen_blocks(random, n, block):
    """Which key blocks each query block sees, measured: with q = 0 every visible key weighs the
    same (times its count), and v = the one-hot of the key's block makes each output the share of
    weight each key block gets."""
    heads = random.shape[0]
    length = n * block
    q = jnp.zeros((1, length, heads, n))
    k = jax.random.normal(jax.random.key(0), (1, length, heads, n))
    v = jnp.broadcast_to(jax.nn.one_hot(jnp.arange(length) // block, n)[None, :, None, :], (1, length, heads, n))
    out = _probe(q, k, v, random, block)
    share = np.asarray(out[0]).reshape(n, block, heads, n)[:, 0].transpose(1, 0, 2)  # [heads, query block, key block]
    return share


def test_each_query_block_sees_the_papers_pattern():
    """BigBird-ITC (section 2, appendix D): query blocks 0 and n-1 see every key block; every other
    block i sees global blocks 0 and n-1, the window i-1, i, i+1, and r random blocks outside those,
    equally weighted (q = 0). The attention's measured shares match, and `pattern` says the same."""
    n, block, heads, r = 12, 2, 3, 2
    random = block_sparse.draw_random_blocks(jax.random.key(1), heads, n, r)
    share = seen_blocks(random, n, block)
    for h in range(heads):
        for i in range(n):
            if i in (0, n - 1):
                want = set(range(n))
            else:
                rand = set(np.asarray(random[h, i - 1]).tolist())
                assert len(rand) == r and not rand & {0, n - 1, i - 1, i, i + 1}, (h, i, rand)
                want = {0, n - 1, i - 1, i, i + 1} | rand
            seen = set(np.flatnonzero(share[h, i] > 1e-6).tolist())
            assert seen == want, (h, i, seen, want)
            np.testing.assert_allclose(share[h, i][sorted(want)], 1 / len(want), atol=1e-5)  # each block once
    np.testing.assert_array_equal(block_sparse.pattern(random) > 0, share > 1e-6)
    # HF's evaluation table (transformers 4.57.6 draws no random blocks in eval): every random slot is
    # block 0, so a middle query block weighs block 0 r + 1 times, beside its window and the last block.
    share = seen_blocks(block_sparse.eval_random_blocks(heads, n, r), n, block)
    i = 5
    want = np.zeros(n)
    want[[0, i - 1, i, i + 1, n - 1]] = 1
    want[0] += r
    np.testing.assert_allclose(share[0, i], want / want.sum(), atol=1e-5)


def test_memory_is_linear_in_length():
    """No [L, L] array: the largest intermediate of the compiled attention grows linearly with L."""
    def biggest(length):
        heads, width, block, r = 2, 8, 16, 2
        x = jax.ShapeDtypeStruct((1, length, heads, width), jnp.float32)
        keys = jax.ShapeDtypeStruct((1, length), jnp.bool_)
        random = block_sparse.eval_random_blocks(heads, length // block, r)
        jaxpr = jax.make_jaxpr(lambda q, k, v, m: block_sparse.attend(q, k, v, m, block=block, random=random))(
            x, x, x, keys)
        return max(np.prod(var.aval.shape) for eqn in jaxpr.eqns for var in eqn.outvars)
    # the middle blocks' scores, [heads, batch, n-2, block, (5 + r)·block], are the largest
    assert biggest(1024) == 2 * (1024 // 16 - 2) * 16 * 7 * 16
    assert biggest(4096) == 2 * (4096 // 16 - 2) * 16 * 7 * 16 < 4096 * 4096


def test_block_sparse_is_off_by_default_and_refuses_what_it_cannot_mask():
    assert (TransformerConfig().sparse_block_size, TransformerConfig().num_random_blocks) == (None, 0)
    with pytest.raises(UserError, match="sparse_block_size"):
        TransformerConfig(sparse_block_size=4, local_attention=8)
    cfg = TransformerConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                            sparse_block_size=2, num_random_blocks=1)
    x = jnp.zeros((1, 16, 8))
    packed = Mask(keys=jnp.ones((1, 16), bool), documents=jnp.ones((1, 16), jnp.int32))
    with pytest.raises(UserError, match="block-sparse attention"):
        Attention(cfg).init(jax.random.key(0), x, packed, None, True)


# --- the tiny config learns -------------------------------------------------------------------------------------

def test_tiny_learns():
    """The tiny preset's network, trained as pretraining does (dropout on, so each step draws its
    random blocks), on a fixed batch of 96-token rows (12 blocks of 8: block-sparse): 25 Adam steps
    of masked-LM loss at 15 masked positions a row cut the loss by far more than the noise. A
    direct jitted loop: `train()`'s setup and compiles cost half a minute on a CPU that this
    check does not need (the loop itself is every other family's)."""
    import optax

    c = helpers.config("bigbird", "tiny")
    c.model.vocab_size = vocab = 64
    length, rows, predictions = 96, 8, 15
    assert not block_sparse.too_short(length, c.model.sparse_block_size, c.model.num_random_blocks)
    model = models.build(c.model)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (rows, length)).astype(np.int32)
    at = np.sort(np.stack([rng.choice(length, predictions, replace=False) for _ in range(rows)]), axis=1)
    masked = ids.copy()
    np.put_along_axis(masked, at, 4, axis=1)  # a [MASK]-like id
    batch = dict(input_ids=masked, input_mask=np.ones_like(ids), masked_positions=at.astype(np.int32))
    targets = np.take_along_axis(ids, at, axis=1)
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    opt = optax.adamw(3e-3)

    def loss(params, key):
        logits = model.apply({"params": params}, batch, deterministic=False, rngs={"dropout": key})["mlm_logits"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    @jax.jit
    def step(params, state, key):
        value, grads = jax.value_and_grad(loss)(params, key)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    state, losses = opt.init(params), []
    for i in range(25):
        params, state, value = step(params, state, jax.random.key(i + 1))
        losses.append(float(value))
    mlm = np.array(losses)
    print(f"\nbigbird tiny mlm loss: first 5 {mlm[:5].mean():.3f}, last 5 {mlm[-5:].mean():.3f}")
    assert np.isfinite(mlm).all()
    assert mlm[-5:].mean() < mlm[:5].mean() - 0.75, mlm  # nats: far beyond step-to-step noise


# --- presets ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["tiny", "base", "large"])
def test_presets_pass_validation(preset):
    c = helpers.config("bigbird", preset)
    c.model.vocab_size = c.model.vocab_size or 8192
    validation.check(c)


@pytest.mark.parametrize("preset, hf_overrides", [
    ("base", {}),
    # google/bigbird-roberta-large's config.json
    ("large", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16)),
])
def test_released_presets_are_hf_shapes(preset, hf_overrides):
    """The base and large presets build HF's network, tensor for tensor (on torch's meta device),
    and export to that config (block-sparse, blocks of 64, 3 random blocks, tanh GELU)."""
    c = helpers.config("bigbird", preset)
    batch = {"input_ids": np.zeros((1, 4), np.int32), "masked_positions": np.zeros((1, 4), np.int32),
             "input_mask": np.ones((1, 4), np.int32)}
    params = jax.eval_shape(lambda: nn.meta.unbox(models.build(c.model).init(jax.random.key(0), batch)))["params"]
    ours = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    with torch.device("meta"):
        hf = transformers.BigBirdForMaskedLM(transformers.BigBirdConfig(**hf_overrides))
    assert ours == sum(p.numel() for p in hf.parameters())  # the tied decoder counted once on both sides
    print(f"\nbigbird {preset}: {ours / 1e6:.1f}M parameters")
    block = c.model.to_dict()
    record = records.for_run(block)
    assert record.model_type == "big_bird"
    exported = hf_config.to_hf(record, block, "model", models.encoder_config(block), None)
    default = transformers.BigBirdConfig(**hf_overrides)
    keys = [k for k in record.defaults if k in exported]
    assert {k: exported[k] for k in keys} == {k: getattr(default, k) for k in keys}


# --- warm start from RoBERTa ---------------------------------------------------------------------------------

def test_a_warm_started_roberta_computes_what_the_roberta_did(tmp_path):
    """Zaheer et al. start BigBird from RoBERTa's checkpoint: a tiny RoBERTa run turned into a
    BigBird (positions from 0, its 16 learned rows repeated out to 64) gives the RoBERTa's logits
    on rows too short for the block-sparse pattern, where BigBird attends fully; the pattern's
    settings are the block's; from a fine-tuning run, the task's head and name come along."""
    from bertology.families.bigbird import warm_start

    roberta, params, batch, head = helpers.roberta_fine_tuning_run(tmp_path / "roberta")
    assert warm_start.main(["--from", str(tmp_path / "roberta"), "--to", str(tmp_path / "bigbird"), "--positions", "64",
                            "--block_size", "4", "--random_blocks", "1"]) == 0
    big_params, big_config = load_params(tmp_path / "bigbird")
    block = big_config["model"]
    assert (block["family"], block["position_offset"], block["max_position_embeddings"], block["sparse_block_size"],
            block["num_random_blocks"]) == ("bigbird", 0, 64, 4, 1)
    assert big_config["task"] == "sst2"
    np.testing.assert_array_equal(big_params["head"]["kernel"], head["kernel"])
    old = params["encoder"]["embeddings"]["position"]["embedding"]
    np.testing.assert_array_equal(big_params["encoder"]["embeddings"]["position"]["embedding"], np.tile(old[2:], (4, 1)))
    assert 12 < (5 + 2 * 1) * 4  # HF's max_tokens_to_attend: shorter rows attend fully
    a = np.asarray(jax.jit(roberta.apply)({"params": params}, batch)["mlm_logits"])
    b = np.asarray(jax.jit(models.build(block).apply)({"params": big_params}, batch)["mlm_logits"])
    real = batch["input_mask"].astype(bool)
    print(f"\nwarm-started bigbird max abs diff: {np.abs(a - b)[real].max():.2e}")
    np.testing.assert_allclose(b[real], a[real], atol=1e-5)
    assert warm_start.main(["--from", str(tmp_path / "bigbird"), "--to", str(tmp_path / "again")]) == 2  # not a RoBERTa
