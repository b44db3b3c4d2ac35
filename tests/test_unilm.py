"""UniLM and the BERT-as-encoder route: per-row mask kinds, the `unilm` data transform, starting
from BERT, training, and sequence-to-sequence decoding.

References are independent of the code under test: mask matrices built by hand from unilm-v1's
rules (`src/biunilm/seq2seq_loader.py`), perturbation of later/earlier tokens, statistics of the transform over many
batches, a Hugging Face BERT run under the same hand-built masks as a 3-D attention mask, and a
full-recompute greedy decoder.
"""

import functools
import types

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bertology import models, objectives
from bertology.data import transforms
from bertology.errors import UserError
from bertology.families.bart import model as bart
from bertology.families.unilm import data as unilm_data
from bertology.families.unilm import model as unilm
from bertology.generation import beam_search, generate
from bertology.models.transformer import Mask, TransformerConfig

V = 97
BIDI, L2R, R2L, S2S = range(4)
TOK = types.SimpleNamespace(vocab_size=1000, pad_id=0, cls_id=2, sep_id=3, mask_id=4, unk_id=1, eos_id=3,
                            special_ids=frozenset({0, 1, 2, 3, 4}))


def tiny(**kw) -> TransformerConfig:
    base = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                max_position_embeddings=32, type_vocab_size=6, dropout_rate=0.0, attention_dropout_rate=0.0)
    return TransformerConfig(**{**base, **kw})


def hand_built(kind: int, n: int, length: int, prefix: int) -> np.ndarray:
    """unilm-v1's matrix (1 = may attend) for a row of n real tokens in `length` slots."""
    m = np.zeros((length, length), bool)
    if kind == BIDI:
        m[:, :n] = True
    elif kind == L2R:
        m[:n, :n] = np.tril(np.ones((n, n), bool))
    elif kind == R2L:
        m[:n, :n] = np.triu(np.ones((n, n), bool))
    else:  # every row sees the source columns; target rows add tril over the target
        m[:, :prefix] = True
        m[prefix:n, prefix:n] = np.tril(np.ones((n - prefix, n - prefix), bool))
    m[n:, :] = m[n:, :] & (np.arange(length) < n)  # padding queries: real keys only (never read)
    return m


def lowered(mask: Mask, rows=None) -> np.ndarray:
    allowed, is_causal = mask.lower(rows)
    assert not is_causal
    q = mask.keys.shape[1] if rows is None else np.asarray(rows).shape[1]
    return np.broadcast_to(np.asarray(allowed), (mask.keys.shape[0], 1, q, mask.keys.shape[1]))[:, 0]


# ---------------------------------------------------------------- mask kinds


def test_each_mask_kind_equals_the_hand_built_matrix():
    length = 7
    kinds, lengths, prefix = np.array([BIDI, L2R, R2L, S2S, S2S]), np.array([7, 5, 6, 7, 5]), np.array([0, 0, 0, 3, 2])
    batch = {"input_mask": (np.arange(length)[None] < lengths[:, None]).astype(np.int32),
             "mask_kind": kinds.astype(np.int32), "prefix_length": prefix.astype(np.int32)}
    mask = Mask.from_batch(batch)
    assert not mask.causal  # a prefix_length with mask_kind is the seq2seq source, not a prefix-LM model
    got = lowered(mask)
    expect = np.stack([hand_built(k, n, length, p) for k, n, p in zip(kinds, lengths, prefix)])
    real = batch["input_mask"][:, :, None] > 0  # rows of padding queries are never read
    np.testing.assert_array_equal(got & real, expect & real)
    # s2s: a source query sees no target key; the first target sees the source and itself
    assert not got[3, 1, 3] and got[3, 3, :4].all() and not got[3, 3, 4]
    # rows: the chosen queries of every kind (the decoder's new positions, the MLM's gathered ones)
    rows = np.array([[6, 2], [0, 4], [5, 1], [3, 6], [1, 4]])
    np.testing.assert_array_equal(lowered(mask, jnp.asarray(rows)), np.take_along_axis(got, rows[:, :, None], 1))


def _model_and_batch(rng, kinds, prefix, length=12):
    model = unilm.Model(tiny())
    b = len(kinds)
    batch = {"input_ids": rng.integers(5, V, (b, length)).astype(np.int32),
             "input_mask": np.ones((b, length), np.int32),
             "segment_ids": np.zeros((b, length), np.int32),
             "mask_kind": np.asarray(kinds, np.int32), "prefix_length": np.asarray(prefix, np.int32),
             "masked_positions": np.tile(np.arange(length, dtype=np.int32), (b, 1))}
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    return model, params, batch


def test_outputs_ignore_what_each_kind_must_not_see():
    """Change token 7: left-to-right and seq2seq-target outputs before it are bit-identical, as
    are seq2seq source outputs (the source never sees the target); right-to-left outputs after
    it too. A bidirectional row, and the positions that may see it, do change."""
    rng = np.random.default_rng(0)
    model, params, batch = _model_and_batch(rng, [BIDI, L2R, R2L, S2S], [0, 0, 0, 5])
    changed = {**batch, "input_ids": batch["input_ids"].copy()}
    changed["input_ids"][:, 7] = (changed["input_ids"][:, 7] + 1) % V
    run = lambda b: np.asarray(model.apply({"params": params}, b)["mlm_logits"])  # noqa: E731
    a, b = run(batch), run(changed)
    np.testing.assert_array_equal(a[1, :7], b[1, :7])  # l2r: the past
    np.testing.assert_array_equal(a[3, :7], b[3, :7])  # s2s: source (0-4) and target before 7 (5, 6)
    np.testing.assert_array_equal(a[2, 8:], b[2, 8:])  # r2l: the future
    for row, seen in ((0, slice(None)), (1, slice(7, None)), (2, slice(0, 8)), (3, slice(7, None))):
        assert np.abs(a[row, seen] - b[row, seen]).min() > 0, row
    # r2l: an earlier change never reaches a later output
    earlier = {**batch, "input_ids": batch["input_ids"].copy()}
    earlier["input_ids"][2, 3] = (earlier["input_ids"][2, 3] + 1) % V
    np.testing.assert_array_equal(run(batch)[2, 4:], run(earlier)[2, 4:])


# ---------------------------------------------------------------- the data transform


def data_cfg(**kw):
    fields = dict(objective="unilm", max_seq_length=32, max_predictions_per_seq=5, masked_lm_prob=0.15,
                  short_seq_prob=0.1, masking="dynamic", mask_prob=0.8, random_prob=0.1)
    return ml_collections.ConfigDict({**fields, **kw})


def documents(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(10, 1000, rng.integers(3, 12)).astype(np.int32) for _ in range(rng.integers(2, 7))]
            for _ in range(n)]


def test_transform_mixes_the_kinds_per_batch_with_their_segments():
    t = transforms.make(data_cfg(), TOK)
    inst = t.instances(documents(), np.random.default_rng(0))
    rng = np.random.default_rng(1)
    rows, batches = 32, 300
    counts = np.zeros(4)
    for i in range(batches):
        idx = rng.choice(len(inst["input_ids"]), rows, replace=False)
        out = t.corrupt({k: v[idx] for k, v in inst.items()}, rng)
        per = np.bincount(out["mask_kind"], minlength=4)
        # every batch: floor or ceil of its share (32/3 = 10.7, 32/6 = 5.3)
        assert np.all(per >= np.floor(rows * np.array([1, .5, .5, 1]) / 3))
        assert np.all(per <= np.ceil(rows * np.array([1, .5, .5, 1]) / 3))
        counts += per
        real, second = out["input_mask"] > 0, inst["segment_ids"][idx] > 0
        for r, kind in enumerate(out["mask_kind"]):
            first_id, second_id = unilm.UNILM_SEGMENTS[Mask.KINDS[kind]]
            np.testing.assert_array_equal(out["segment_ids"][r][real[r]],
                                          np.where(second[r], second_id, first_id)[real[r]])
            source = np.count_nonzero(real[r] & ~second[r])  # [CLS] A [SEP]
            assert out["prefix_length"][r] == (source if kind == S2S else 0)
    share = counts / counts.sum()
    # expected exactly 1/3, 1/6, 1/6, 1/3; 9600 rows give a standard error below 0.005
    np.testing.assert_allclose(share, [1 / 3, 1 / 6, 1 / 6, 1 / 3], atol=0.015)


def test_ngram_masking_is_one_fifth_bigrams_or_trigrams_at_bert_rates():
    rng = np.random.default_rng(0)
    rows, length, budget = 400, 1000, 20
    candidate = np.ones((rows, length), bool)
    positions, weights = unilm_data.unilm_ngrams(candidate, np.full(rows, budget), budget, rng, 0.2, 3)
    assert weights.sum(axis=1).tolist() == [budget] * rows
    runs = []
    for r in range(rows):  # units rarely touch in 1000 slots, so runs of masked tokens are the units
        p = positions[r]
        breaks = np.flatnonzero(np.diff(p) != 1)
        runs += np.diff(np.concatenate([[-1], breaks, [len(p) - 1]])).tolist()
    runs = np.array(runs)
    unit_share = np.mean(runs >= 2)
    assert abs(unit_share - 0.2) < 0.03, unit_share
    assert abs(np.mean(runs[runs >= 2] == 2) - 0.5) < 0.08  # n uniform on {2, 3}
    # end to end on real rows: BERT's budget and 80/10/10
    t = transforms.make(data_cfg(max_seq_length=64, max_predictions_per_seq=20), TOK)
    inst = t.instances(documents(300), np.random.default_rng(0))
    out = t.corrupt(inst, np.random.default_rng(1))
    n = inst["input_mask"].sum(1)
    np.testing.assert_array_equal(out["masked_weights"].sum(1),
                                  np.minimum(20, np.maximum(1, np.rint(0.15 * n))))
    w = out["masked_weights"] > 0
    now = np.take_along_axis(out["input_ids"], out["masked_positions"], 1)[w]
    orig = out["masked_ids"][w]
    assert abs(np.mean(now == TOK.mask_id) - 0.8) < 0.03
    assert abs(np.mean((now != TOK.mask_id) & (now != orig)) - 0.1) < 0.03
    assert not np.isin(orig, list(TOK.special_ids)).any()


def test_transform_refuses_static_masking_and_bad_shares():
    with pytest.raises(UserError, match="data.masking=dynamic"):
        transforms.make(data_cfg(masking="static", dupe_factor=2), TOK)
    with pytest.raises(UserError, match="shares"):
        transforms.make(data_cfg(noise={"seq2seq": -1.0}), TOK)
    with pytest.raises(UserError, match="does not apply"):
        transforms.make(data_cfg(noise={"density": 0.2}), TOK)


# ---------------------------------------------------------------- starting from BERT


def _hf_bert(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bertology.interop import import_hf
    from bertology.train.checkpoint import load_params

    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, hidden_act="gelu"))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.eval().save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "run")
    params, config = load_params(tmp_path / "run")
    return hf, params, config


def test_bert_checkpoint_starts_unilm_and_matches_bert_under_each_mask(tmp_path):
    """A converted HF BERT loads into UniLM: every encoder tensor and the MLM head, the segment
    table widened as unilm-v1 does; UniLM's logits under each kind equal HF BERT's own under the
    hand-built matrix (a 3-D attention mask), with UniLM's segment ids mapped to BERT's 0/1."""
    import torch
    import transformers

    hf, bert, config = _hf_bert(tmp_path)
    assert config["model"]["family"] == "bert"
    model = unilm.Model(tiny())
    rng = np.random.default_rng(3)
    length, kinds, lengths, prefix = 12, [BIDI, L2R, R2L, S2S], np.array([12, 9, 10, 11]), np.array([0, 0, 0, 5])
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    second = (np.arange(length)[None] >= np.array([6, 0, 0, 5])[:, None]) & (np.array(kinds)[:, None] != L2R) \
        & (np.array(kinds)[:, None] != R2L)
    bert_segments = second.astype(np.int32) * mask
    ours = np.array([[0, 1], [2, 2], [3, 3], [4, 5]])[kinds]
    batch = {"input_ids": (rng.integers(5, V, (4, length)) * mask).astype(np.int32), "input_mask": mask,
             "segment_ids": np.where(second, ours[:, 1:], ours[:, :1]).astype(np.int32) * mask,
             "mask_kind": np.array(kinds, np.int32), "prefix_length": prefix.astype(np.int32),
             "masked_positions": np.tile(np.arange(length, dtype=np.int32), (4, 1))}
    fresh = nn.meta.unbox(jax.jit(model.init)(jax.random.key(1), batch)["params"])
    params = unilm.from_bert(bert, fresh)

    for path, leaf in jax.tree_util.tree_leaves_with_path(bert["encoder"]):
        got = np.asarray(_at(params["encoder"], path))
        if jax.tree_util.keystr(path).endswith("['segment']['embedding']"):
            np.testing.assert_array_equal(got, np.asarray(leaf)[[0, 1, 0, 0, 0, 1]])
        else:
            np.testing.assert_array_equal(got, np.asarray(leaf), err_msg=jax.tree_util.keystr(path))
    for path, leaf in jax.tree_util.tree_leaves_with_path(bert["mlm"]):
        np.testing.assert_array_equal(np.asarray(_at(params["mlm"], path)), np.asarray(leaf))

    logits = np.asarray(jax.jit(model.apply)({"params": params}, batch)["mlm_logits"])
    matrices = np.stack([hand_built(k, n, length, p) for k, n, p in zip(kinds, lengths, prefix)])
    attention_mask = torch.tensor(matrices, dtype=torch.long)
    if int(transformers.__version__.split(".")[0]) >= 5:
        # transformers 5 reads a 3-D mask as a padding mask (and fails to expand it); a 4-D mask it
        # hands to the attention as it is, which adds it to the scores: 0 to attend, a large
        # negative number not to (transformers 4 made that itself from a 3-D mask, refusing 4-D).
        attention_mask = (1.0 - attention_mask[:, None].float()) * torch.finfo(torch.float32).min
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=attention_mask,
                 token_type_ids=torch.tensor(bert_segments, dtype=torch.long)).prediction_logits.numpy()
    real = mask > 0
    np.testing.assert_allclose(logits[real], ref[real], atol=1e-4)

    small = unilm.Model(tiny(hidden_size=16, intermediate_size=32))
    with pytest.raises(UserError, match="has shape"):
        unilm.from_bert(bert, nn.meta.unbox(jax.jit(small.init)(jax.random.key(1), batch)["params"]))
    with pytest.raises(UserError, match="no `encoder`"):
        unilm.from_bert({"decoder": {}}, fresh)


def _at(tree, path):
    for k in path:
        tree = tree[k.key]
    return tree


def test_bert2bert_encoder_comes_from_bert_and_decoder_stays_fresh(tmp_path):
    import torch

    hf, bert, _ = _hf_bert(tmp_path)
    block = helpers.config("bert2bert", "tiny").model
    block.update(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                 max_position_embeddings=32, dropout_rate=0.0, attention_dropout_rate=0.0)
    model = models.build(block)
    assert isinstance(model, bart.Model)
    rng = np.random.default_rng(4)
    mask = (np.arange(10)[None] < np.array([[10], [7]])).astype(np.int32)
    batch = {"input_ids": (rng.integers(5, V, (2, 10)) * mask).astype(np.int32), "input_mask": mask,
             "decoder_input_ids": rng.integers(5, V, (2, 6)).astype(np.int32),
             "decoder_input_mask": np.ones((2, 6), np.int32)}
    fresh = nn.meta.unbox(jax.jit(model.init)(jax.random.key(2), batch)["params"])
    params = unilm.from_bert(bert, fresh)
    jax.tree.map(np.testing.assert_array_equal, params["decoder"], fresh["decoder"])
    encoded = np.asarray(model.apply({"params": params}, batch, method=bart.Model.encode))
    with torch.no_grad():
        ref = hf.bert(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                      attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state.numpy()
    np.testing.assert_allclose(encoded[mask > 0], ref[mask > 0], atol=1e-4)


# ---------------------------------------------------------------- training and decoding


def test_tiny_unilm_learns_on_mixed_batches():
    """Sentences of consecutive ids: every masked token follows from a neighbour on either side,
    so each kind can learn it and the loss falls well below log(vocab)."""
    rng = np.random.default_rng(0)
    docs = [[(10 + (s + np.arange(rng.integers(4, 12))) % 80).astype(np.int32) for s in rng.integers(0, 80, 4)]
            for _ in range(200)]
    t = transforms.make(data_cfg(), TOK)
    inst = t.instances(docs, np.random.default_rng(0))
    model = unilm.Model(tiny(vocab_size=TOK.vocab_size))
    objective = objectives.get("roberta")
    rng = np.random.default_rng(1)
    first = t.corrupt({k: v[:16] for k, v in inst.items()}, rng)
    params = jax.jit(model.init)(jax.random.key(0), first)["params"]
    opt = optax.adam(3e-3)
    state = jax.jit(opt.init)(params)

    @jax.jit
    def step(params, state, batch):
        (loss, _), grads = jax.value_and_grad(objective, has_aux=True)(params, batch, None, model)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(40):  # a fresh mixed, masked batch each step, from a small pool of rows
        idx = rng.choice(len(inst["input_ids"]), 16, replace=False)
        params, state, loss = step(params, state, t.corrupt({k: v[idx] for k, v in inst.items()}, rng))
        losses.append(float(loss))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


def full_recompute(model, params, ids, mask, targets):
    """Log-probabilities [rows, vocab] of the next target token from the whole sequence [left-padded
    source, targets so far, [MASK]] run from scratch, no cache (the reference of cached decoding)."""
    rows, source_length = ids.shape
    seq = np.concatenate([ids, targets, np.full((rows, 1), 4, np.int32)], 1)
    seq_mask = np.concatenate([mask, np.ones((rows, targets.shape[1] + 1), np.int32)], 1)
    positions = np.maximum(np.cumsum(seq_mask, 1) - 1, 0).astype(np.int32)
    batch = unilm.seq2seq_batch(jnp.asarray(seq), jnp.asarray(seq_mask), jnp.asarray(positions), source_length,
                                jnp.arange(seq.shape[1]))
    batch["masked_positions"] = jnp.full((rows, 1), seq.shape[1] - 1, jnp.int32)
    return np.asarray(_next_log_probs(model, params, batch))


@functools.partial(jax.jit, static_argnums=0)
def _next_log_probs(model, params, batch):
    """Jitted: one program per sequence length, where op-by-op dispatch took most of a minute."""
    return jax.nn.log_softmax(jax.jit(model.apply)({"params": params}, batch)["mlm_logits"][:, 0])


@pytest.fixture(scope="module")
def unilm_sources():
    """(model, params, left-padded sources [3, 7] of 7, 4 and 5 tokens, their mask)."""
    model = unilm.Model(tiny())
    rng = np.random.default_rng(5)
    source_length, total = 7, 13
    lengths = np.array([7, 4, 5])
    mask = (np.arange(source_length)[None] >= (source_length - lengths)[:, None]).astype(np.int32)
    ids = (rng.integers(5, V, (3, source_length)) * mask).astype(np.int32)
    probe = unilm.seq2seq_batch(jnp.zeros((3, total), jnp.int32), jnp.ones((3, total), jnp.int32),
                                jnp.zeros((3, total), jnp.int32), source_length, jnp.arange(total))
    params = jax.jit(model.init)(jax.random.key(7), {**probe, "masked_positions": jnp.zeros((3, 1), jnp.int32)})["params"]
    return model, params, ids, mask


def test_greedy_seq2seq_with_the_cache_equals_full_recompute(unilm_sources):
    model, params, ids, mask = unilm_sources
    max_length, eos = 6, 3
    got = generate(model, params, ids, mask, max_new_tokens=max_length, mask_id=4, eos_id=eos)
    targets = np.zeros((3, 0), np.int32)
    for _ in range(max_length):
        best = full_recompute(model, params, ids, mask, targets).argmax(-1)
        targets = np.concatenate([targets, best[:, None].astype(np.int32)], 1)
    ended = np.cumsum(targets == eos, axis=1) - (targets == eos) > 0  # after each row's first EOS: EOS
    np.testing.assert_array_equal(got, np.where(ended, eos, targets))
    assert len(np.unique(targets)) > 3  # a random model's argmaxes differ step to step: not a trivial match


def test_beam_search_hypotheses_score_their_full_recompute_log_probabilities(unilm_sources):
    model, params, ids, mask = unilm_sources
    steps, penalty = 5, 0.8
    greedy = generate(model, params, ids, mask, max_new_tokens=steps, mask_id=4)
    eos = int(np.bincount(greedy.ravel()).argmax())  # an id the model emits, so hypotheses end at different lengths
    beams = beam_search(model, params, ids, mask, num_beams=3, max_new_tokens=steps, mask_id=4, eos_id=eos,
                        length_penalty=penalty)
    lengths = set()
    for row in range(3):
        for tokens, score in zip(beams.tokens[row], beams.scores[row]):
            tokens = list(tokens)
            n = tokens.index(eos) + 1 if eos in tokens else steps
            lengths.add(n)
            total = 0.0
            for t in range(n):  # the cache followed each beam's reordering iff every step's log p matches
                prefix = np.asarray([tokens[:t]], np.int32).reshape(1, t)
                total += full_recompute(model, params, ids[row:row + 1], mask[row:row + 1], prefix)[0, tokens[t]]
            assert score == pytest.approx(total / n ** penalty, abs=1e-4)
        assert list(beams.scores[row]) == sorted(beams.scores[row], reverse=True)
    assert len(lengths) > 1
    with pytest.raises(UserError, match="mask_id is UniLM's"):
        generate(model, params, ids, mask, max_new_tokens=steps)


def test_finetuning_masks_70_percent_of_the_target_as_unilm_v1():
    rng = np.random.default_rng(11)
    n = 4000
    sources = [rng.integers(5, 1000, rng.integers(1, 9)) for _ in range(n)]
    targets = [rng.integers(5, 1000, rng.integers(1, 12)) for _ in range(n)]
    rows = unilm.finetune_rows(sources, targets, 10, 12, TOK)
    assert list(rows["input_ids"][0][: len(sources[0]) + len(targets[0]) + 3]) == \
        [2, *sources[0], 3, *targets[0], 3]  # [CLS] source [SEP] target [SEP]
    out = unilm.mask_targets(rows, np.random.default_rng(0), TOK, max_predictions=6)
    lengths = np.array([len(t) + 1 for t in targets])  # the closing [SEP] is a target token
    counts = out["masked_weights"].sum(1)
    np.testing.assert_array_equal(counts, np.minimum(6, np.maximum(1, np.round(0.7 * lengths))))
    rowsel, k = np.nonzero(out["masked_weights"])
    pos = out["masked_positions"][rowsel, k]
    prefix = rows["prefix_length"][rowsel]
    assert (pos >= prefix).all() and (pos < prefix + lengths[rowsel]).all()  # only target slots
    assert all(len(set(p[w > 0])) == w.sum() for p, w in zip(out["masked_positions"], out["masked_weights"]))
    np.testing.assert_array_equal(out["masked_ids"][rowsel, k], rows["input_ids"][rowsel, pos])
    source_slots = np.arange(22)[None] < rows["prefix_length"][:, None]
    np.testing.assert_array_equal(out["input_ids"][source_slots], rows["input_ids"][source_slots])
    # Uncapped rows (at most 8 target tokens: round(0.7 * 8) = 6): 70% of the target masked,
    # the closing [SEP] as often as any other slot.
    short = lengths <= 8
    assert counts[short].sum() / lengths[short].sum() == pytest.approx(0.7, abs=0.03)
    sep_masked = [(p[w > 0] == rows["prefix_length"][i] + lengths[i] - 1).any()
                  for i, (p, w) in enumerate(zip(out["masked_positions"], out["masked_weights"])) if short[i]]
    expected = np.mean(np.round(0.7 * lengths[short]) / lengths[short])
    assert np.mean(sep_masked) == pytest.approx(expected, abs=0.03)
    new = out["input_ids"][rowsel, pos]
    original = rows["input_ids"][rowsel, pos]
    assert np.mean(new == 4) == pytest.approx(0.8, abs=0.02)  # [MASK]
    assert np.mean(new == original) == pytest.approx(0.1, abs=0.015)  # kept
