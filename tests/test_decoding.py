"""How each model decodes (`bertology.models.decoding`) and where an encoder-decoder's decoder
starts: the rules generation and seq2seq fine-tuning read instead of asking for a family.
Decoding itself is checked token for token against Hugging Face's `generate` in test_beam.py,
test_generation.py and test_unilm.py."""

import ml_collections
import pytest

from bertology import models
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.generation import decoder_start_id, frame_source
from bertology.models import decoding

SIZES = dict(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=32)


def _model(family: str, **extra):
    return models.build(ml_collections.ConfigDict({"family": family, **SIZES, **extra}))


@pytest.mark.parametrize("family, way", [("gpt", decoding.DECODER_ONLY), ("bart", decoding.ENCODER_DECODER),
                                         ("t5", decoding.ENCODER_DECODER), ("bert", None), ("roberta", None)])
def test_each_network_has_its_way_of_decoding(family, way):
    assert decoding.decoding_of(_model(family)) is way


def test_unilm_states_its_own_masked_decoding():
    way = decoding.decoding_of(_model("unilm", type_vocab_size=6))
    assert way is not None and way not in (decoding.DECODER_ONLY, decoding.ENCODER_DECODER)
    assert way.transduces and way.left_pad and way.takes_mask and not way.takes_start
    with pytest.raises(UserError, match="is not a decoder"):
        decoding.require(_model("bert"))


def test_decoder_start_is_the_data_setting_then_eos_for_bart_and_fairseq_denoisers_else_pad():
    tok = load_tokenizer(DEFAULT_VOCAB)
    bart, t5 = _model("bart"), _model("t5")
    assert decoder_start_id({}, bart, tok) == tok.eos_id  # an imported BART has no pretraining objective
    assert decoder_start_id({"objective": "span_corruption"}, t5, tok) == tok.pad_id
    assert decoder_start_id({}, t5, tok) == tok.pad_id
    for objective in ("bart", "mass"):  # fairseq's denoisers start from EOS whatever the network
        assert decoder_start_id({"objective": objective}, t5, tok) == tok.eos_id
    assert decoder_start_id({"objective": "bart", "decoder_start": 7}, bart, tok) == 7


def test_sources_are_framed_as_each_model_reads_them():
    tok = load_tokenizer(DEFAULT_VOCAB)
    ids = list(range(10, 20))
    assert frame_source(_model("bart"), tok, ids, 6) == [10, 11, 12, 13, 14, tok.eos_id]
    assert frame_source(_model("unilm", type_vocab_size=6), tok, ids, 6) == [tok.cls_id, 10, 11, 12, 13, tok.sep_id]
