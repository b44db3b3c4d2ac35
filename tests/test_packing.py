"""Packing: lossless, tight, and a packed row encodes each document exactly as it would alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertology import models
from bertology.data import packing
from bertology.errors import UserError
from bertology.models.transformer import Encoder

CLS, SEP = 2, 3


def docs(rng, n, vocab=100):
    return [[rng.integers(5, vocab, rng.integers(1, 12)) for _ in range(rng.integers(1, 4))] for _ in range(n)]


def test_pieces_and_rows_are_lossless_and_within_length():
    rng = np.random.default_rng(0)
    documents = docs(rng, 40)
    pieces = packing.document_pieces(documents, 32, CLS, SEP)
    assert all(len(p) <= 32 and p[0] == CLS and p[-1] == SEP for p in pieces)
    body = np.concatenate([p[1:-1] for p in pieces])
    np.testing.assert_array_equal(body, np.concatenate([np.concatenate(d) for d in documents]))

    packed = packing.pack(pieces, 32)
    ids, mask, pid, pos = (packed[k] for k in ("input_ids", "input_mask", "packing_ids", "positions"))
    assert mask.sum() == sum(len(p) for p in pieces)
    found = sorted(tuple(ids[r][pid[r] == k]) for r in range(len(ids)) for k in range(1, pid[r].max() + 1))
    assert found == sorted(tuple(p) for p in pieces)
    for r in range(len(ids)):  # positions restart at 0 on each piece; pad has id 0
        for k in range(1, pid[r].max() + 1):
            np.testing.assert_array_equal(pos[r][pid[r] == k], np.arange((pid[r] == k).sum()))
        assert ((pid[r] == 0) == (mask[r] == 0)).all()
    unpacked = packing.one_per_row(pieces, 32)
    assert len(ids) <= 1.25 * np.ceil(mask.sum() / 32) < len(unpacked["input_ids"])
    assert packing.padding_fraction(mask) < packing.padding_fraction(unpacked["input_mask"]) / 2


def test_causal_pieces_overlap_by_one_token_and_lose_nothing():
    rng = np.random.default_rng(2)
    documents = docs(rng, 40) + [[np.zeros(0, np.int64)], []]  # documents without tokens are skipped
    for length in (2, 5, 16):
        pieces = packing.causal_pieces(documents, length, eos_id=SEP)
        assert all(2 <= len(p) <= length for p in pieces)
        rebuilt, at = [], 0
        for doc in documents[:40]:  # each document's pieces in order: drop the repeated first token
            tokens = np.concatenate([*doc, [SEP]])
            parts = [pieces[at]]
            while sum(len(p) - 1 for p in parts) + 1 < len(tokens):
                assert pieces[at + len(parts)][0] == parts[-1][-1]  # starts on the previous cut's last token
                parts.append(pieces[at + len(parts)])
            at += len(parts)
            assert all(len(p) == length for p in parts[:-1])
            rebuilt.append(np.concatenate([parts[0]] + [p[1:] for p in parts[1:]]))
            np.testing.assert_array_equal(rebuilt[-1], tokens)
        assert at == len(pieces)


def test_bad_lengths_fail_with_one_line():
    with pytest.raises(UserError, match="too short to pack"):
        packing.document_pieces([[np.arange(4)]], 2, CLS, SEP)
    with pytest.raises(UserError, match="too short for language modelling"):
        packing.causal_pieces([[np.arange(4)]], 1, SEP)
    with pytest.raises(UserError, match="more than max_seq_length 8"):
        packing.pack([np.arange(9)], 8)


SHAPE = dict(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, dropout_rate=0.0,
             attention_dropout_rate=0.0)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_packed_row_encodes_like_its_documents_alone(family):
    """ModernBERT's unpadded batches (Warner et al. 2024, "unpadding": documents back to back, attention
    within each) are packed rows here: with its rotary positions restarting per document and a
    window (layer 0 global, layer 1 local, 3 tokens each side) narrower than the documents, each
    document's states equal those it gets alone in a padded row."""
    block = dict(family=family, **SHAPE) | (dict(local_attention=6, global_attn_every_n_layers=2,
                                                 max_position_embeddings=48) if family == "modernbert" else {})
    cfg = models.encoder_config(block)
    assert family == "bert" or (cfg.positions, cfg.local_attention) == ("rotary", 6)
    pieces = packing.document_pieces(docs(np.random.default_rng(1), 3), 48, CLS, SEP)
    packed = packing.pack(pieces, 48)
    assert packed["packing_ids"][0].max() >= 2  # the first row really holds several documents
    encoder = Encoder(cfg)
    row = {k: jnp.asarray(v[:1]) for k, v in packed.items()}
    params = jax.jit(encoder.init)(jax.random.key(0), row)
    out = jax.jit(encoder.apply)(params, row)["sequence"][0]
    pid = packed["packing_ids"][0]
    for k in range(1, pid.max() + 1):
        alone = packing.one_per_row([row["input_ids"][0][pid == k]], 48)
        ref = encoder.apply(params, {k: jnp.asarray(v) for k, v in alone.items()})["sequence"][0]
        np.testing.assert_allclose(out[pid == k], ref[: (pid == k).sum()], atol=1e-5)
