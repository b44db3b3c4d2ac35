"""Transformer-XL and XLNet trained end to end through the pretraining loop on the embedded corpus:
the contiguous LM lanes continue one token stream, both families' losses fall, and a run killed
after a checkpoint and resumed equals an uninterrupted one, losses and carried memory."""

import importlib.util
import pathlib
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from bertology.data import lanes
from bertology.data.embedded import BYTE_BPE_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.data.transforms import make

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


def get_config(name: str, preset: str = "tiny") -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset)


def test_contiguous_lm_lanes_continue_one_stream_with_next_token_targets():
    tok = load_tokenizer(BYTE_BPE_VOCAB)
    rng = np.random.default_rng(0)
    docs = [[rng.integers(5, 300, n) for n in rng.integers(0, 9, 3)] for _ in range(40)] + [[np.zeros(0, int)]]
    transform = make(ml_collections.ConfigDict({"objective": "contiguous_lm", "max_seq_length": 5}), tok)
    assert transform.contiguous
    out = transform.instances(docs, np.random.default_rng(1), 3)
    # the stream as the reference builds it: each document's sentences then eos, empty ones dropped
    stream = np.concatenate([np.concatenate([*d, [tok.eos_id]]) for d in docs if sum(map(len, d))])
    offset = lanes.cut({"i": np.arange(len(stream))}, 3, 5, np.random.default_rng(1))["i"]
    ids, targets, weights = out["input_ids"], out["targets"], out["target_weights"]
    assert ids.shape == targets.shape == weights.shape == offset.shape and ids.dtype == np.int32
    np.testing.assert_array_equal(ids, stream[offset])
    # every token predicts the next of the stream, across sentences, documents and segments
    np.testing.assert_array_equal(targets, stream[offset + 1])
    assert (weights == 1.0).all()
    lane = ids.reshape(3, -1)
    np.testing.assert_array_equal(lane[0, 1:], stream[offset[0, 0, 0] + 1: offset[0, 0, 0] + lane.shape[1]])
