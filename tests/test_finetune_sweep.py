"""The equal-FLOP sweep's cost model, against sums worked out by hand."""

import ml_collections
import pytest

from bertology.sweep import flops_per_token


def config(family, **model):
    return ml_collections.ConfigDict(dict(
        model=dict(family=family, num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, **model),
        data=dict(max_seq_length=64, max_predictions_per_seq=10),
    ))


def test_bert_flops_per_token():
    encoder = 6 * (12 * 2 * 128**2 + 2 * 2 * 64 * 128)  # 2,555,904
    head = 6 * (128 * 128 + 128 * 8192) * 10 / 64  # 998,400: the MLM head on 10 of 64 positions
    assert flops_per_token(config("bert"), 8192) == pytest.approx(encoder + head) == pytest.approx(3_554_304)


def test_electra_adds_its_generator_and_a_one_unit_head():
    c = config("electra", embedding_size=64, generator_fraction=0.25)
    generator = 6 * (12 * 2 * 32**2 + 2 * 2 * 64 * 32) + 6 * (32 * 64 + 64 * 8192) * 10 / 64
    discriminator = 6 * (12 * 2 * 128**2 + 2 * 2 * 64 * 128) + 6 * (128 * 128 + 128)
    assert flops_per_token(c, 8192) == pytest.approx(generator + discriminator) == pytest.approx(3_345_024)
