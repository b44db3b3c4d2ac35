"""ELMo (families/elmo/model.py, objectives/bilm.py, the bilm transform, families/elmo/hdf5.py).

References: a float64 numpy LSTMP step written from TF's LSTMCell definition, bilm-tf's character
id conventions spelled out by hand, perturbation of later/earlier words, the CLI's training run on
the embedded corpus, and the reference's hdf5 dataset names.
"""

import json
import shutil

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import _two_topic_sst2

from bertology import pretrain
from bertology.data import transforms, words
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.families.elmo import model as elmo

TINY = elmo.ElmoConfig(vocab_size=37, filters=((1, 4), (2, 6), (3, 8)), n_highway=1, projection_dim=8, lstm_dim=12,
                       max_characters_per_token=10, dropout_rate=0.0)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_lstmp_step_equals_numpy_tf_lstmcell():
    rng = np.random.default_rng(0)
    n_in, d, p, b = 5, 7, 3, 4
    params = {"kernel": rng.normal(size=(n_in + p, 4 * d)), "bias": rng.normal(size=4 * d),
              "projection": rng.normal(size=(d, p))}
    x, c0, h0 = rng.normal(size=(b, n_in)) * 3, rng.normal(size=(b, d)) * 3, rng.normal(size=(b, p))
    # TF LSTMCell(num_proj, cell_clip, proj_clip): [x, h] @ W + b -> i, j, f, o; forget bias 1.
    z = np.concatenate([x, h0], -1) @ params["kernel"] + params["bias"]
    i, j, f, o = np.split(z, 4, axis=-1)
    c = np.clip(sigmoid(f + 1.0) * c0 + sigmoid(i) * np.tanh(j), -3, 3)
    h = np.clip((sigmoid(o) * np.tanh(c)) @ params["projection"], -0.5, 0.5)
    with jax.enable_x64():
        p64 = jax.tree.map(jnp.asarray, params)
        c_ours, h_ours = elmo.lstmp_step(p64, (jnp.asarray(c0), jnp.asarray(h0)),
                                         jnp.asarray(x) @ p64["kernel"][:n_in] + p64["bias"], 3.0, 0.5)
    np.testing.assert_allclose(c_ours, c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h_ours, h, rtol=1e-12, atol=1e-12)
    assert np.abs(c).max() == 3.0 and np.abs(h).max() == 0.5  # both clips were exercised


def test_char_ids_follow_bilm_tf():
    # bilm-tf: BOW 258, bytes, EOW 259, pad 260 (training ids), then +1 for inference (0 = no word).
    np.testing.assert_array_equal(words.word_char_ids("hé", 8), np.array([258, 104, 195, 169, 259, 260, 260, 260]) + 1)
    np.testing.assert_array_equal(words.word_char_ids("<S>", 5), np.array([258, 256, 259, 260, 260]) + 1)
    np.testing.assert_array_equal(words.word_char_ids("</S>", 5), np.array([258, 257, 259, 260, 260]) + 1)
    long = words.word_char_ids("abcdefghij", 6)  # cut to max_chars - 2 bytes, EOW kept
    np.testing.assert_array_equal(long, np.array([258, 97, 98, 99, 100, 259]) + 1)
    table = words.char_id_table(["[PAD]", "x"], 4)
    assert not table[0].any() and table.max() < words.N_CHARACTERS


def test_char_cnn_shapes_and_padding_words():
    chars = np.stack([words.word_char_ids(w, 10) for w in ["<S>", "open", "the", "file", "</S>"]])[None]
    chars = np.concatenate([chars, np.zeros((1, 2, 10), np.int32)], axis=1)  # two padding words
    cnn = elmo.CharCNN(TINY)
    params = jax.jit(cnn.init)(jax.random.PRNGKey(0), chars)["params"]
    assert params["char_embed"].shape == (261, 16)  # bilm-tf's file rows: ids 1..261
    assert params["W_cnn_2"].shape == (3, 16, 8) and params["W_proj"].shape == (18, 8)
    apply = jax.jit(cnn.apply)
    out = apply({"params": params}, chars)
    assert out.shape == (1, 7, 8)
    # A padding word reads only zero embeddings: its vector is the same whatever row 0 of the table holds.
    moved = jax.tree.map(lambda x: x, params)
    moved["char_embed"] = params["char_embed"].at[0].set(100.0)
    np.testing.assert_array_equal(apply({"params": moved}, chars)[0, 5:], out[0, 5:])


def _batch(ids, packing_ids):
    table = np.random.default_rng(1).integers(1, 262, size=(TINY.vocab_size, TINY.max_characters_per_token))
    return {"char_ids": jnp.asarray(table[ids]), "packing_ids": jnp.asarray(packing_ids)}


def test_directions_see_only_their_side_and_pieces_stay_apart():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, TINY.vocab_size, size=(2, 9))
    packing_ids = np.array([[1] * 5 + [2] * 4, [1] * 7 + [0] * 2])
    model = elmo.Model(TINY)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), _batch(ids, packing_ids))["params"]
    apply = jax.jit(model.apply)
    base = apply({"params": params}, _batch(ids, packing_ids))
    t = 2
    changed = ids.copy()
    changed[:, t] = (changed[:, t] + 1) % TINY.vocab_size
    out = apply({"params": params}, _batch(changed, packing_ids))
    fwd_moved = np.abs(out["forward_logits"] - base["forward_logits"]).max(-1) > 0
    bwd_moved = np.abs(out["backward_logits"] - base["backward_logits"]).max(-1) > 0
    # forward at s reads words <= s of its piece; backward at s reads words >= s of its piece.
    np.testing.assert_array_equal(fwd_moved[0], [False, False, True, True, True, False, False, False, False])
    np.testing.assert_array_equal(bwd_moved[0], [True, True, True, False, False, False, False, False, False])
    # a piece equals itself alone: row 0's second piece is encoded as if it started the row
    alone = apply({"params": params}, _batch(ids[:1, 5:], np.ones((1, 4), np.int64)))
    np.testing.assert_allclose(alone["forward_logits"][0], base["forward_logits"][0, 5:], atol=1e-5)
    np.testing.assert_allclose(alone["backward_logits"][0], base["backward_logits"][0, 5:], atol=1e-5)
    assert [x.shape for x in base["layers"]] == [(2, 9, 16)] * 3


def test_bilm_transform_makes_forward_and_reversed_sentence_lanes(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "</S>", "a", "b", "c"]) + "\n")
    tok = load_tokenizer(vocab)
    import ml_collections
    cfg = ml_collections.ConfigDict(dict(objective="bilm", max_seq_length=2, max_characters_per_token=8))
    t = transforms.make(cfg, tok)
    assert t.contiguous
    docs = [[np.array([7, 8, 9]), np.array([9])], [np.array([8, 7])]]
    forward = [5, 7, 8, 9, 6, 5, 9, 6, 5, 8, 7, 6]  # <S> a b c </S> <S> c </S> <S> b a </S>
    backward = [6, 9, 8, 7, 5, 6, 9, 5, 6, 7, 8, 5]  # each sentence reversed, in the same order
    rng = np.random.default_rng(0)
    offset = int(np.random.default_rng(0).integers(2))  # the offset `lanes.cut` draws from the pass rng
    rows = t.instances(docs, rng, 1)
    steps = (12 - offset) // 2
    assert rows["input_ids"].shape == (1, steps, 2)
    np.testing.assert_array_equal(rows["input_ids"].reshape(-1), forward[offset:offset + 2 * steps])
    np.testing.assert_array_equal(rows["backward_input_ids"].reshape(-1), backward[offset:offset + 2 * steps])
    np.testing.assert_array_equal(rows["targets"].reshape(-1), (forward + [0])[offset + 1:offset + 1 + 2 * steps])
    np.testing.assert_array_equal(rows["backward_targets"].reshape(-1), (backward + [0])[offset + 1:offset + 1 + 2 * steps])
    two = t.instances(docs, np.random.default_rng(0), 2)  # two lanes: each a contiguous half
    half = (12 - offset) // 2
    np.testing.assert_array_equal(two["input_ids"][1].reshape(-1)[:2], forward[offset + half:offset + half + 2])
    batch = t.corrupt({k: v[:, 0] for k, v in rows.items()}, None)
    np.testing.assert_array_equal(batch["char_ids"][0, 0], words.word_char_ids(tok.convert_ids_to_tokens([forward[offset]])[0], 8))
    np.testing.assert_array_equal(batch["backward_char_ids"][0, 0],
                                  words.word_char_ids(tok.convert_ids_to_tokens([backward[offset]])[0], 8))


def test_stateful_segments_equal_one_long_scan():
    """Reading T segments one by one, each from the carry the one before returned, gives the
    outputs and final states of one scan over their concatenation from zero states."""
    rng = np.random.default_rng(0)
    lanes_, steps, length = 3, 4, 5
    ids = rng.integers(1, TINY.vocab_size, size=(lanes_, steps * length))
    back = rng.integers(1, TINY.vocab_size, size=(lanes_, steps * length))
    table = np.random.default_rng(1).integers(1, 262, size=(TINY.vocab_size, TINY.max_characters_per_token))
    model = elmo.Model(TINY)
    zero = jax.tree.map(jnp.asarray, elmo.initial_carry(dict(family="elmo", **TINY.__dict__), lanes_))
    whole = {"char_ids": table[ids], "backward_char_ids": table[back], "carry": zero}
    params = jax.jit(model.init)(jax.random.PRNGKey(0), whole)["params"]
    apply = jax.jit(lambda b: model.apply({"params": params}, b))
    ref = apply(whole)
    carry, fwd, bwd = zero, [], []
    for t in range(steps):
        cut = slice(t * length, (t + 1) * length)
        out = apply({"char_ids": table[ids[:, cut]], "backward_char_ids": table[back[:, cut]], "carry": carry})
        carry = out["carry"]
        fwd.append(out["forward_logits"])
        bwd.append(out["backward_logits"])
    np.testing.assert_allclose(np.concatenate(fwd, 1), ref["forward_logits"], atol=1e-5)
    np.testing.assert_allclose(np.concatenate(bwd, 1), ref["backward_logits"], atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), carry, ref["carry"])
    assert carry["forward"]["c"].shape == (lanes_, 2, TINY.lstm_dim) and carry["backward"]["h"].shape == (lanes_, 2, 8)
    # the carry is used: the last segment from zero states reads differently
    alone = apply({"char_ids": table[ids[:, -length:]], "backward_char_ids": table[back[:, -length:]], "carry": zero})
    assert np.abs(alone["forward_logits"] - fwd[-1]).max() > 1e-3


def _tiny_stateful(workdir, steps, **overrides):
    from bertology.train.loop import train

    c = helpers.config("elmo", "tiny")
    c.model.update(filters=[[1, 4], [2, 8]], projection_dim=16, lstm_dim=24)
    c.update(batch_size=8, total_steps=steps, log_every=1, eval_every=0, checkpoint_every=3, seed=3)
    c.data.max_seq_length = 6
    c.update(overrides)
    return train(c, workdir)


def test_stateful_training_resumes_exactly(tmp_path):
    """A run killed after its checkpoint at step 3 (its later checkpoint removed) and rerun gives
    the losses and LSTM states of one uninterrupted run."""
    whole = _tiny_stateful(tmp_path / "whole", 6)
    shutil.copytree(tmp_path / "whole", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "6")
    second = _tiny_stateful(tmp_path / "killed", 6)
    assert [h["step"] for h in second["history"]] == [4, 5, 6]
    assert [h["loss"] for h in second["history"]] == [h["loss"] for h in whole["history"][3:]]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(second["state"]["carry"]),
                 jax.device_get(whole["state"]["carry"]))
    assert np.abs(jax.device_get(whole["state"]["carry"]["forward"]["h"])).max() > 0  # states were carried


def test_hdf5_round_trip_and_reference_names(tmp_path):
    h5py = pytest.importorskip("h5py")
    from bertology.families.elmo import hdf5

    model = elmo.Model(TINY)
    ids = np.ones((1, 3), np.int64)
    params = jax.device_get(jax.jit(model.init)(jax.random.PRNGKey(3), _batch(ids, ids))["params"])
    hdf5.write(tmp_path, TINY, elmo.trunk(params))
    with h5py.File(tmp_path / "weights.hdf5") as f:
        names = set()
        f.visititems(lambda name, obj: names.add(name) if isinstance(obj, h5py.Dataset) else None)
        assert f["CNN/W_cnn_1"].shape == (1, 2, 16, 6) and f["char_embed"].shape == (261, 16)
        assert f["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"].shape == (16, 48)
    expected = {"char_embed", "CNN_proj/W_proj", "CNN_proj/b_proj",
                *(f"CNN/{k}_cnn_{i}" for i in range(3) for k in "Wb"),
                *(f"CNN_high_0/{k}" for k in ("W_carry", "b_carry", "W_transform", "b_transform")),
                *(f"RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell/{n}" for d in range(2) for k in range(2)
                  for n in ("W_0", "B", "W_P_0"))}
    assert names == expected
    opts = json.loads((tmp_path / "options.json").read_text())
    assert opts["char_cnn"]["filters"] == [[1, 4], [2, 6], [3, 8]] and opts["lstm"]["dim"] == 12
    cfg, back = hdf5.read(tmp_path, TINY.vocab_size)
    assert cfg == TINY
    jax.tree.map(np.testing.assert_array_equal, back, elmo.trunk(params))


# AllenNLP's released biLMs, named elmo_2x{cells}_{projection}_2048cnn_{highway}xhighway: the
# options.json each ships (one char CNN and LSTM block for all three; only the sizes differ).
RELEASED = {"small": (1024, 128, 1), "medium": (2048, 256, 1), "original": (4096, 512, 2)}


@pytest.mark.parametrize("preset", RELEASED)
def test_presets_write_the_released_options(preset):
    from bertology.families.elmo import hdf5

    cells, projection, highway = RELEASED[preset]
    released = {
        "lstm": {"use_skip_connections": True, "projection_dim": projection, "cell_clip": 3, "proj_clip": 3,
                 "dim": cells, "n_layers": 2},
        "char_cnn": {"activation": "relu", "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                     "n_highway": highway, "embedding": {"dim": 16}, "n_characters": 262, "max_characters_per_token": 50},
        "dropout": 0.1,
    }
    c = helpers.config("elmo", preset)
    c.model.vocab_size = 100
    assert hdf5.options(elmo.config(c.model)) == released
    assert hdf5.config_from_options(released, 100) == elmo.config(c.model)  # the released files load into it


@pytest.mark.slow
@pytest.mark.optimized
def test_tiny_bilm_learns_on_embedded_corpus(tmp_path):
    status = pretrain.main(["pretrain", "--config", "configs/elmo.py:tiny", "--workdir", str(tmp_path),
                            "--config.total_steps=30", "--config.batch_size=16", "--config.log_every=10",
                            "--config.eval_every=0", "--config.checkpoint_every=30"])
    assert status == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ppl = [r["perplexity"] for r in rows if "perplexity" in r]
    assert ppl[0] > 2000  # near uniform over the 4k-word vocabulary at the start
    assert ppl[-1] < 0.5 * ppl[0] and rows[-1]["forward_perplexity"] < 1000 and rows[-1]["backward_perplexity"] < 1000


@pytest.fixture(scope="module")
def elmo_run(tmp_path_factory):
    """A tiny stateful biLM run (3 steps): a checkpoint to take features from."""
    root = tmp_path_factory.mktemp("elmo_run")
    _tiny_stateful(root, 3)
    return root


@pytest.mark.parametrize("task_encoder", ["none", "bilstm_attn"])
def test_classification_from_elmo_features_learns_and_leaves_the_bilm_frozen(tmp_path, elmo_run, task_encoder):
    """The mix and a linear head, or GLUE's BiLSTM+ELMo+Attn task model (`models/task_encoders.py`)."""
    from bertology.train.checkpoint import load_params
    from bertology.train.finetune import default_config, finetune

    saved, run_config = load_params(elmo_run)
    c = default_config("sst2")
    c.update(init_checkpoint=str(elmo_run), mode="features", total_steps=40, batch_size=16, eval_batch_size=16,
             log_every=1)
    c.data.dir = str(_two_topic_sst2(tmp_path / "data", run_config["data"]["vocab"]))
    c.data.max_seq_length = 12
    # only the head and the mix train, over small mean-pooled vectors; the LSTMs take a smaller step
    c.optimizer.learning_rate = 0.1 if task_encoder == "none" else 0.03
    c.task_encoder.update(name=task_encoder, hidden_size=16, classifier_hidden_size=16)
    c.mesh.shape = (1, 1)
    result = finetune(c, tmp_path / "run")
    assert ("task_encoder" in result["params"]) == (task_encoder != "none")
    losses = result["train_loss"]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.1, losses
    assert result["scores"]["accuracy"] > 80
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(result["params"]["encoder"]), elmo.trunk(saved))
    assert not np.allclose(np.asarray(result["params"]["mix"]["weights"]), 0.0)  # the scalar mix learned
    assert result["params"]["mix"]["weights"].shape == (3,)  # char CNN + 2 LSTM layers


@pytest.mark.parametrize("mode", ["full", "adapters"])
def test_elmo_fine_tunes_only_frozen(tmp_path, elmo_run, mode):
    """The family states its modes (its record's `task_modes`): the biLM is used through the scalar mix only,
    and the one-line error says so for both other modes."""
    from bertology.train.finetune import default_config, finetune

    c = default_config("sst2")
    c.update(init_checkpoint=str(elmo_run), mode=mode, total_steps=1)
    with pytest.raises(UserError, match=f"^the elmo trunk fine-tunes with mode features, not {mode}; set mode=features$"):
        finetune(c, tmp_path / "run")


def test_elmo_features_are_the_bilm_layers(elmo_run):
    from bertology import features
    from bertology.train.checkpoint import load_params

    texts = ["open the file", "the file is open and the value is returned"]
    out = features.extract(elmo_run, texts, layers=(0,), max_seq_length=12)
    params, run_config = load_params(elmo_run)
    cfg = elmo.config(run_config["model"])
    tok = load_tokenizer(run_config["data"]["vocab"])
    ids = out["input_ids"]
    assert ids[0, 0] == tok.cls_id and (out["tokens"][out["input_mask"] == 0] == 0).all()
    # row 0: <S> open the file </S> read alone, as the biLM reads a sentence
    names = ["<S>", *tok.convert_ids_to_tokens(ids[0, 1:4].tolist()), "</S>"]
    chars = np.stack([words.word_char_ids(w, cfg.max_characters_per_token) for w in names])[None]
    layers = elmo.Model(cfg).apply({"params": elmo.trunk(params)}, {"char_ids": jnp.asarray(chars),
                                   "input_mask": jnp.ones((1, 5), jnp.int32)}, method="representations")
    np.testing.assert_allclose(out["tokens"][0, :5], layers[0][0], atol=1e-5)
    mixed = features.extract(elmo_run, texts, layers=(1, 2), max_seq_length=12)
    np.testing.assert_allclose(mixed["tokens"][0, :5], (layers[1][0] + layers[2][0]) / 2, atol=1e-5)
    mask = out["input_mask"][1].astype(bool)
    np.testing.assert_allclose(mixed["sentence"][1], mixed["tokens"][1][mask].mean(0), atol=1e-5)


@pytest.mark.parametrize("kind, labels", [("token", 5), ("qa", 2), ("classification", 3)])
def test_elmo_features_feed_every_head_and_only_the_mix_and_head_learn(kind, labels):
    """The frozen biLM under each head: outputs per position (tagging, QA start/end) or per row, and
    a loss through them sends gradient to the scalar mix and the head, none into the biLM."""
    from bertology.models.tasks import TaskModel

    rng = np.random.default_rng(0)
    mask = (np.arange(6)[None] < np.array([[6], [4]])).astype(np.int32)
    batch = {"input_ids": rng.integers(1, TINY.vocab_size, (2, 6)).astype(np.int32), "input_mask": mask,
             "char_ids": rng.integers(1, 262, (2, 6, TINY.max_characters_per_token)).astype(np.int32)}
    model = TaskModel(TINY, kind, labels, mode="features", family="elmo")
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    out = jax.jit(model.apply)({"params": params}, batch)
    if kind == "qa":
        assert out["start_logits"].shape == out["end_logits"].shape == (2, 6)
    else:
        assert out["logits"].shape == ((2, 6, labels) if kind == "token" else (2, labels))

    def loss(p):
        o = model.apply({"params": p}, batch)
        return sum(jnp.sum(jnp.sin(v)) for v in o.values())

    grads = jax.jit(jax.grad(loss))(params)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["encoder"]))
    for part in ("mix", "head"):
        assert any(float(jnp.abs(g).max()) > 0.0 for g in jax.tree.leaves(grads[part]))
