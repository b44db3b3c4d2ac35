"""Encoder-decoder decoding against Hugging Face: random BART and T5 (v1.0 and v1.1 shapes) built
in transformers, converted into ours, and decoded by both with the same settings, several source
rows of different lengths in one batch. Greedy tokens, and beam search's every returned hypothesis
and its score, must be transformers' `generate` output token for token."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import BEAM_SOURCE_LENGTHS as SOURCE_LENGTHS  # noqa: E402
from helpers import NEW, START, build_hf, hf_generate, until_eos  # noqa: E402

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.generation import beam_search, generate  # noqa: E402
from bertology.interop import import_hf  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

SETTINGS = [  # (num_beams, length_penalty, early_stopping)
    (3, 1.0, False),
    (4, 0.6, True),
    (3, 2.0, "never"),
    (2, -0.5, False),
]


@pytest.fixture(scope="module", params=list(START))
def converted(request, tmp_path_factory):
    """(name, HF model, our model, our params, the sources, an EOS id the models often emit)."""
    name = request.param
    hf = build_hf(name, seed=1)
    directory = tmp_path_factory.mktemp(name)
    hf.save_pretrained(directory / "hf")
    import_hf(directory / "hf", directory / "run")
    params, config = load_params(directory / "run")
    model = models.build(config["model"])
    rng = np.random.default_rng(0)
    width = max(SOURCE_LENGTHS)
    mask = (np.arange(width)[None] < np.array(SOURCE_LENGTHS)[:, None]).astype(np.int32)
    ids = (rng.integers(3, hf.config.vocab_size, mask.shape) * mask).astype(np.int32)
    # Random models rarely emit a fixed id; the token our greedy decoding produces most often
    # makes hypotheses end at different lengths, which is what beam search's bookkeeping is about.
    greedy = generate(model, params, ids, mask, max_new_tokens=NEW, decoder_start_id=START[name])
    eos = int(np.bincount(greedy[:, 1:].ravel()).argmax())
    return name, hf, model, params, (ids, mask), eos


def test_greedy_equals_transformers(converted):
    name, hf, model, params, sources, eos = converted
    ours = generate(model, params, *sources, max_new_tokens=NEW, decoder_start_id=START[name], eos_id=eos)
    theirs = hf_generate(hf, sources, eos, START[name], num_beams=1).sequences.numpy()
    assert (theirs[:, 0] == START[name]).all()
    ended = 0
    for row_ours, row_theirs in zip(ours, theirs[:, 1:]):
        assert until_eos(row_ours, eos) == until_eos(row_theirs, eos)
        ended += eos in row_ours.tolist()
    assert 0 < ended  # EOS ends some rows early (after it ours keeps emitting EOS)
    assert (ours[:, -1] == eos).sum() >= ended


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", SETTINGS)
def test_beam_search_equals_transformers(converted, num_beams, length_penalty, early_stopping):
    name, hf, model, params, sources, eos = converted
    beams = beam_search(model, params, *sources, num_beams=num_beams, max_new_tokens=NEW, eos_id=eos,
                        decoder_start_id=START[name], length_penalty=length_penalty, early_stopping=early_stopping)
    out = hf_generate(hf, sources, eos, START[name], num_beams=num_beams, num_return_sequences=num_beams,
                      length_penalty=length_penalty, early_stopping=early_stopping)
    theirs = out.sequences.numpy()[:, 1:].reshape(len(SOURCE_LENGTHS), num_beams, -1)
    ended = 0
    for b in range(len(SOURCE_LENGTHS)):
        for r in range(num_beams):
            hyp = until_eos(beams.tokens[b, r], eos)
            assert hyp == until_eos(theirs[b, r], eos), (b, r)
            ended += hyp[-1] == eos
    np.testing.assert_allclose(beams.scores, out.sequences_scores.numpy().reshape(len(SOURCE_LENGTHS), num_beams),
                               rtol=1e-5, atol=1e-5)
    assert ended  # some hypotheses were finished by EOS, not only by the length limit
    best = generate(model, params, *sources, max_new_tokens=NEW, eos_id=eos, decoder_start_id=START[name],
                    num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
    np.testing.assert_array_equal(best, beams.tokens[:, 0])


def test_scores_are_length_penalised_log_probabilities(converted):
    """Each returned score is its hypothesis' summed log-probability under teacher forcing over
    its length**length_penalty, recomputed here from a plain forward pass."""
    name, _, model, params, (ids, mask), eos = converted
    penalty = 0.7
    beams = beam_search(model, params, ids, mask, num_beams=3, max_new_tokens=NEW, eos_id=eos,
                        decoder_start_id=START[name], length_penalty=penalty)
    for r in range(3):
        hyps = [until_eos(beams.tokens[b, r], eos) for b in range(len(ids))]
        width = max(map(len, hyps))
        targets = np.array([h + [0] * (width - len(h)) for h in hyps], np.int32)
        weights = (np.arange(width)[None] < np.array([len(h) for h in hyps])[:, None])
        decoder_ids = np.concatenate([np.full((len(ids), 1), START[name]), targets[:, :-1]], axis=1).astype(np.int32)
        logits = np.asarray(model.apply({"params": params}, {
            "input_ids": ids, "input_mask": mask, "decoder_input_ids": decoder_ids,
            "decoder_input_mask": np.ones_like(decoder_ids)})["logits"], np.float64)
        log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        picked = np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
        expected = (picked * weights).sum(1) / weights.sum(1) ** penalty
        np.testing.assert_allclose(beams.scores[:, r], expected, rtol=1e-4, atol=1e-4)


def test_refusals(converted):
    name, _, model, params, (ids, mask), eos = converted
    with pytest.raises(UserError, match="needs decoder_start_id"):
        generate(model, params, ids, mask, max_new_tokens=2)
    with pytest.raises(UserError, match="beam search is deterministic"):
        generate(model, params, ids, mask, max_new_tokens=2, decoder_start_id=0, num_beams=2, temperature=0.5)
    with pytest.raises(UserError, match="early_stopping="):
        beam_search(model, params, ids, mask, num_beams=2, max_new_tokens=2, decoder_start_id=0, early_stopping="soon")
    with pytest.raises(UserError, match="source 1 has no tokens"):
        generate(model, params, ids, mask * np.array([[1], [0], [1], [1]]), max_new_tokens=2, decoder_start_id=0)
