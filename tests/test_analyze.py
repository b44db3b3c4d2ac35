"""`bertology.analyze similarity` (Ethayarajh 2019): the word's pieces are found in WordPiece and
byte-level BPE text; self-similarity and anisotropy are numpy's cosines over the trunk's layers;
a layer that cannot see the context gives self-similarity 1 (BERT's embeddings for a word at the
same position, every layer of a causal GPT for a sentence's first word); the CLI writes its json
and plot; bad input is one line."""

import json

import flax.linen as nn
import helpers
import jax
import numpy as np
import pytest

from bertology import analyze, models
from bertology.data.tokenizers import for_data
from bertology.errors import UserError
from bertology.features import layer_states

SAME_START = ["broke the vase on the floor .", "broke the news to the family .", "broke the record at the games ."]
MIDDLE = ["the vase broke on the floor .", "she broke the news gently .", "he finally broke the record ."]


def _run(tmp_path, family):
    """A random-weight run of `family`'s tiny preset (BERT: WordPiece; GPT: byte-level BPE)."""
    config = helpers.config(family, "tiny")
    config.model.update(vocab_size=for_data(config.data).vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                        intermediate_size=64)
    model = models.build(config.model)
    batch = {k: np.zeros((1, 8), np.int32) for k in ("input_ids", "segment_ids", "masked_positions")}
    batch["input_mask"] = np.ones((1, 8), np.int32)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch)["params"])
    # weights 20x the initial scale: at init's 0.02 the residual stream is all embedding, so the
    # attention layers would barely move a vector (self-similarity 0.99999 in every layer)
    params = jax.tree.map(lambda x: np.asarray(x) * 20, params)
    return helpers.write_run(tmp_path / family, config, params), config


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_word_pieces_are_the_words_tokens(family):
    tokenizer = for_data(helpers.config(family, "tiny").data)
    for text, word in [("the vase broke on the floor .", "broke"), ("unbreakable records broke", "broke"),
                       ("a broken-hearted reader", "broken"), ("Broke again", "broke")]:
        ids = tokenizer.encode(text)
        pieces = analyze.word_pieces(tokenizer, text, word)
        assert tokenizer.decode(ids[pieces.start:pieces.stop]).strip().lower() == word
    with pytest.raises(ValueError):
        analyze.word_pieces(tokenizer, "unbreakable", "break")  # inside another word: not the word


def test_similarity_is_numpys_cosines_and_the_embeddings_ignore_context(tmp_path):
    run, config = _run(tmp_path, "bert")
    result = analyze.similarity(run, SAME_START + MIDDLE, "broke", max_seq_length=16)
    states = layer_states(run, SAME_START + MIDDLE, max_seq_length=16)
    tokenizer = for_data(config.data)
    vectors = []
    for i, text in enumerate(SAME_START + MIDDLE):
        ids = tokenizer.encode(text)  # the word's pieces: the first span of tokens that decodes to it
        j, k = next((j, k) for j in range(len(ids)) for k in range(j + 1, j + 5)
                    if tokenizer.decode(ids[j:k]).strip() == "broke")
        np.testing.assert_array_equal(states["input_ids"][i, 1 + j:1 + k], ids[j:k])  # after [CLS]
        vectors.append(states["layers"][i, :, 1 + j:1 + k].astype(np.float64).mean(1))
    vectors = np.stack(vectors, 1)  # [layers, n, H]
    assert [r["layer"] for r in result["layers"]] == [0, 1, 2]
    for r, v in zip(result["layers"], vectors):
        u = v / np.linalg.norm(v, axis=-1, keepdims=True)
        pairs = [u[i] @ u[j] for i in range(len(u)) for j in range(len(u)) if i < j]
        assert r["self_similarity"] == pytest.approx(np.mean(pairs), abs=1e-6)
        assert r["adjusted"] == pytest.approx(r["self_similarity"] - r["anisotropy"], abs=1e-12)
        assert -1 <= r["anisotropy"] <= 1
    # at the same position with the same segment, the embedding layer gives the same vector
    first = analyze.similarity(run, SAME_START, "broke", max_seq_length=16)["layers"]
    assert first[0]["self_similarity"] == pytest.approx(1.0, abs=1e-6)
    assert first[-1]["self_similarity"] < 1 - 1e-3  # the attention layers read the rest of the sentence


def test_a_causal_trunk_keeps_a_first_word_context_free_in_every_layer(tmp_path):
    run, _ = _run(tmp_path, "gpt")
    layers = analyze.similarity(run, SAME_START, "broke", max_seq_length=16)["layers"]
    assert len(layers) == 3 and all(r["self_similarity"] == pytest.approx(1.0, abs=1e-5) for r in layers)
    later = analyze.similarity(run, MIDDLE, "broke", max_seq_length=16)["layers"]
    assert later[-1]["self_similarity"] < 1 - 1e-3  # after other words, the context shows


def test_cli_writes_json_and_plot_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    run, _ = _run(tmp_path, "bert")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(MIDDLE) + "\n")
    assert analyze.main(["similarity", f"--checkpoint={run}", "--word=broke", f"--input={sentences}",
                         f"--out={tmp_path / 'out'}", "--max_seq_length=16"]) == 0
    saved = json.loads((tmp_path / "out" / "similarity_broke.json").read_text())
    assert saved["contexts"] == 3 and len(saved["layers"]) == 3
    assert (tmp_path / "out" / "similarity_broke.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    sentences.write_text("the vase broke .\nthe law held .\n")
    assert analyze.main(["similarity", f"--checkpoint={run}", "--word=broke", f"--input={sentences}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("bertology.analyze: error: sentence 2 ('the law held .') does not contain the word 'broke'; "
                    "give sentences that all use it")
    with pytest.raises(UserError, match="at least 2"):
        analyze.similarity(run, ["the vase broke ."], "broke")
