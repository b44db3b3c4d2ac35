"""CoVe (McCann et al. 2017): the attention and a decoder step against numpy written out by hand,
the loss against a hand-computed masked cross-entropy, GloVe files read as released and kept
fixed, and one tiny translation-style run (the embedded source -> target pairs) whose held-out
loss falls and whose features, [embedding; top MT-LSTM layer], feed a classification head."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import _two_topic_sst2, config

from bertology import features, models, objectives, tasks
from bertology.data.tokenizers import for_data
from bertology.data.transforms import seq2seq_rows
from bertology.errors import UserError
from bertology.families.cove import glove
from bertology.families.cove.model import CoveConfig, Model, start
from bertology.train.checkpoint import load_params
from bertology.train.finetune import default_config, finetune

GLOVE_WORDS = ("file", "number", "the")  # in the tiny config's 4k-word vocabulary
SPECIALS = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm(kernel, bias, x, c, h):
    """A plain LSTM cell, gates i, j (input), f, o in that order, forget bias 1."""
    z = np.concatenate([x, h], -1) @ kernel + bias
    i, j, f, o = np.split(z, 4, axis=-1)
    c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j)
    return c, sigmoid(o) * np.tanh(c)


def reference_step(p, c, h, feed, z, memory, mask):
    """The paper's decoder step (§3) in numpy: (c, h per layer, h~, α)."""
    x = np.concatenate([z, feed], -1)
    cs, hs = [], []
    for k in range(c.shape[1]):
        ck, x = lstm(p[f"layer_{k}_kernel"], p[f"layer_{k}_bias"], x, c[:, k], h[:, k])
        cs.append(ck)
        hs.append(x)
    scores = np.einsum("bld,bd->bl", memory, x @ p["attention_kernel"] + p["attention_bias"])
    scores = np.where(mask > 0, scores, -np.inf)
    alpha = np.exp(scores - scores.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    context = np.einsum("bl,bld->bd", alpha, memory)
    h_tilde = np.tanh(np.concatenate([context, x], -1) @ p["combine_kernel"] + p["combine_bias"])
    return np.stack(cs, 1), np.stack(hs, 1), h_tilde, alpha


def tiny_batch(vocab=13):
    rng = np.random.default_rng(0)
    sources = [rng.integers(5, vocab, n) for n in (6, 3)]
    targets = [rng.integers(5, vocab, n) for n in (4, 2)]
    return seq2seq_rows(sources, targets, 6, 4, pad_id=0, decoder_start=0)


@pytest.fixture(scope="module")
def tiny_model():
    cfg = CoveConfig(vocab_size=13, embedding_dim=5, hidden_dim=4, n_layers=2, dropout_rate=0.0)
    model = Model(cfg)
    batch = tiny_batch()
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    params = jax.tree.map(lambda x: x + 0.3 * np.random.default_rng(1).normal(size=x.shape), params)  # biases too
    return model, params, batch


def test_attention_and_decoder_steps_match_numpy(tiny_model):
    """Two incremental steps (`next_token`, what generation runs) from the encoded source: the LSTM
    states, h~ and the logits W_out h~ + b against numpy; α is a distribution that skips padding."""
    model, params, batch = tiny_model
    p = {k: np.asarray(v, np.float64) for k, v in params["decoder"].items()}
    memory = np.asarray(jax.jit(lambda p, b: model.apply({"params": p}, b, method=Model.encode)[1])(params, batch),
                        np.float64)
    mask = batch["input_mask"]
    cache = {"cross_attention": {"memory": jnp.asarray(memory, jnp.float32), "mask": mask}, **start(model.cfg, 2)}
    c = h = np.zeros((2, 2, 4))
    feed = np.zeros((2, 4))
    table = np.asarray(params["target_embed"]["embedding"], np.float64)
    out_w, out_b = (np.asarray(params["output"][k], np.float64) for k in ("kernel", "bias"))
    step = jax.jit(lambda p, cache, token: model.apply({"params": p}, cache, token, method=Model.next_token))
    for token in (batch["decoder_input_ids"][:, 0], batch["decoder_input_ids"][:, 1]):
        c, h, feed, alpha = reference_step(p, c, h, feed, table[token], memory, mask)
        logits, cache = step(params, cache, jnp.asarray(token))
        np.testing.assert_allclose(cache["c"], c, atol=1e-5)
        np.testing.assert_allclose(cache["h"], h, atol=1e-5)
        np.testing.assert_allclose(cache["feed"], feed, atol=1e-5)
        np.testing.assert_allclose(logits, feed @ out_w + out_b, atol=1e-5)
        assert np.all(alpha[1, 3:] == 0) and np.allclose(alpha.sum(-1), 1) and np.all(alpha[:, :3] > 0)
    # teacher forcing computes the same logits as the steps: the decoder reads only earlier targets
    full = jax.jit(model.apply)({"params": params}, batch)["logits"]
    np.testing.assert_allclose(full[:, 1], logits, atol=1e-5)


def test_loss_is_the_masked_cross_entropy_of_the_targets(tiny_model):
    model, params, batch = tiny_model
    loss, _ = jax.jit(lambda p, b: objectives.get("seq2seq")(p, b, None, model))(params, batch)
    logits = np.asarray(jax.jit(model.apply)({"params": params}, batch)["logits"], np.float64)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0]
    expected = (nll[0].sum() + nll[1, :2].sum()) / 6  # 4 + 2 real target tokens; the padding weighs nothing
    assert batch["target_weights"].sum() == 6
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_glove_files_are_read_as_released(tmp_path):
    """Exact entries first, else the lowercased word's; a word the file lacks stays learned;
    a wrong width, a missing file or no known word is one line naming the fix."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(SPECIALS + "the\nParis\nzebra\n")
    vectors = tmp_path / "glove.txt"
    vectors.write_text("the 1 2\nparis 3 4\nParis-x 5 6\nnew york 7 8\n")
    table, found = glove.table(str(vectors), str(vocab), 2)
    assert found.tolist() == [False] * 5 + [True, True, False]
    np.testing.assert_array_equal(table[5:7], [[1, 2], [3, 4]])
    with pytest.raises(UserError, match=r"vectors of 2 numbers but model.embedding_dim=3; set model.embedding_dim=2$"):
        glove.table(str(vectors), str(vocab), 3)
    with pytest.raises(UserError, match="no such file"):
        glove.table(str(tmp_path / "none.txt"), str(vocab), 2)
    (tmp_path / "other.txt").write_text("cat 1 2\n")
    with pytest.raises(UserError, match="has none of the 8 tokens"):
        glove.table(str(tmp_path / "other.txt"), str(vocab), 2)


@pytest.fixture(scope="module")
def cove_run(tmp_path_factory):
    """The tiny preset trained 20 steps on 320 of the embedded pairs (as translation-style JSONL),
    its three GloVe rows fixed; held out at steps 10 and 20. Returns (workdir, results, the GloVe vectors by word)."""
    root = tmp_path_factory.mktemp("cove")
    c = config("cove", "tiny")
    rng = np.random.default_rng(0)
    vectors = {w: rng.normal(size=c.model.embedding_dim).round(4) for w in GLOVE_WORDS}
    (root / "glove.txt").write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items()))
    c.model.glove = str(root / "glove.txt")
    # the embedded pairs through the translation route (`seq2seq_jsonl`), cut to a few: less to tokenize
    pairs = tasks.get("seq2seq_embedded").load(None, log=lambda _: None)
    (root / "pairs").mkdir()
    for split, n in (("train", 320), ("validation", 8)):
        lines = [json.dumps({"source": e["source"], "target": e["target"]}) + "\n" for e in pairs[split][:n]]
        (root / "pairs" / f"{split}.jsonl").write_text("".join(lines))
    c.task = "seq2seq_jsonl"
    c.data.dir = str(root / "pairs")
    c.update(total_steps=20, log_every=5, eval_every=10, batch_size=16, eval_examples=8, eval_batch_size=8)
    c.generation.max_new_tokens = 4
    c.mesh.shape = (1, 1)
    return root / "run", finetune(c, root / "run"), vectors


def test_a_tiny_run_on_the_embedded_pairs_lowers_the_held_out_loss(cove_run):
    _, results, _ = cove_run
    first, last = (e["perplexity"] for e in results["evals"])
    assert [e["step"] for e in results["evals"]] == [10, 20]
    assert last < 0.8 * first, results["evals"]
    assert results["train_loss"][-1] < results["train_loss"][0] - 0.5


def test_glove_rows_stay_fixed(cove_run):
    """In training the file's rows get no gradient and stay the file's vectors; other rows learn."""
    workdir, _, vectors = cove_run
    params, run_config = load_params(workdir)
    model = models.build(run_config["model"])
    tokenizer = for_data(run_config["data"])
    ids = np.asarray([tokenizer.convert_tokens_to_ids(list(GLOVE_WORDS))], np.int32)
    cls = np.full((1, 1), tokenizer.cls_id, np.int32)
    tokens = {"input_ids": np.concatenate([cls, ids], 1), "input_mask": np.ones((1, 4), np.int32)}
    embedded = jax.jit(lambda p, b: model.apply({"params": p}, b, method=Model.encode)[0])(params, tokens)
    np.testing.assert_array_equal(embedded[0, 1:4], np.stack([vectors[w] for w in GLOVE_WORDS]).astype(np.float32))
    batch = {k: np.concatenate([tokens[k]] * 2) for k in ("input_ids", "input_mask")}
    batch.update(decoder_input_ids=batch["input_ids"][:, :3], targets=batch["input_ids"][:, 1:],
                 target_weights=np.ones((2, 3), np.float32))
    grad = jax.jit(jax.grad(lambda p: objectives.get("seq2seq")(p, batch, None, model)[0]))(params)
    rows = np.abs(np.asarray(grad["embed"]["embedding"])).sum(-1)
    assert np.all(rows[ids[0]] == 0) and rows[tokenizer.cls_id] > 0  # [CLS] is learned


def test_features_are_embedding_and_top_layer_and_feed_a_classifier(cove_run, tmp_path):
    workdir, _, vectors = cove_run
    params, run_config = load_params(workdir)
    model = models.build(run_config["model"])
    texts = ["the file is open", "a number"]
    out = features.extract(workdir, texts, max_seq_length=8)
    batch = {"input_ids": out["input_ids"], "input_mask": out["input_mask"]}
    fixed, found = glove.table(run_config["model"]["glove"], run_config["model"]["vocab"], len(vectors["the"]))
    table = np.where(found[:, None], fixed, np.asarray(params["embed"]["embedding"]))  # the file's rows, else learned
    layers = jax.jit(lambda p, b: model.apply({"params": p}, b, method=lambda m, b: m.encoder(
        m.embed(b["input_ids"]), b["input_mask"], True)))(params, batch)
    mask = out["input_mask"][..., None]
    h = run_config["model"]["hidden_dim"]
    assert out["tokens"].shape[-1] == run_config["model"]["embedding_dim"] + 2 * h
    np.testing.assert_allclose(out["tokens"][..., :-2 * h], table[out["input_ids"]] * mask, atol=1e-6)
    np.testing.assert_allclose(out["tokens"][..., -2 * h:], np.asarray(layers[-1]) * mask, atol=1e-5)
    assert not np.allclose(layers[0], layers[-1], atol=1e-2)  # the top layer, not the first

    c = default_config("sst2")
    c.update(init_checkpoint=str(workdir), mode="features", total_steps=20, batch_size=16, eval_batch_size=16,
             log_every=1)
    c.data.update(dir=str(_two_topic_sst2(tmp_path / "data", run_config["data"]["vocab"])), max_seq_length=10)
    c.optimizer.learning_rate = 0.1
    c.mesh.shape = (1, 1)
    result = finetune(c, tmp_path / "sst")
    losses = result["train_loss"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1, losses
    frozen = {k: params[k] for k in ("embed", "encoder")}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(result["params"]["encoder"]), frozen)
