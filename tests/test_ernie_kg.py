"""ERNIE (Tsinghua; Zhang et al. 2019): entity alignment by hand, in pretraining's rows and in task
rows, the aggregator's fusion and the dEA loss against numpy written from thunlp/ERNIE's
modeling.py, the dEA corruption rates, the knowledge-graph files' one-line errors, and one tiny
run on a slice of the embedded example (the standard library's graph) whose loss falls, and which
fine-tuning starts from, its classifier reading the entities of the task text."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import np_gelu, np_layer_norm

from bertology import models
from bertology.data import embedded
from bertology.data.tokenizers import for_data, load_tokenizer
from bertology.errors import UserError
from bertology.families.ernie_kg import knowledge
from bertology.families.ernie_kg.data import entity_inputs
from bertology.families.ernie_kg.model import Aggregator, Config, EntityHead, layer_index, task_inputs
from bertology.families.ernie_kg.objective import dea_means
from bertology.models.tasks import TaskModel
from bertology.models.transformer import Mask
from bertology.objectives import divided
from bertology.tasks.encode import encode_pair, stack


def test_mentions_align_to_their_first_token_longest_first():
    tok = load_tokenizer(embedded.DEFAULT_VOCAB)
    mentions = (("os.path.join", 0), ("os.path", 1), ("json", 2), ("TextIOWrapper", 3), ("path", 4))
    row = np.array(tok.encode("see os.path.join and json.dumps for a TextIOWrapper"))
    # see os . path . join and json . dumps for a textiowrapper
    assert [tok.decode([i]) for i in row] == ["see", "os", ".", "path", ".", "join", "and", "json", ".", "dumps",
                                              "for", "a", "textiowrapper"]
    # os.path.join beats os.path and swallows its "path"; json ends at a word boundary (the "."); dumps is no mention
    expected = [-1, 0, -1, -1, -1, -1, -1, 2, -1, -1, -1, -1, 3]
    assert knowledge.MentionMatcher(mentions, tok).align(row).tolist() == expected


def test_entity_inputs_candidates_labels_and_corruption_rates():
    vectors = np.arange(1, 31, dtype=np.float32).reshape(10, 3)
    ids = np.array([[-1, 7, -1, 2, 7, -1], [-1, -1, -1, -1, -1, -1], [-1, 5, 9, 1, -1, -1]])
    out = entity_inputs(ids, vectors, np.random.default_rng(0), max_entities=2, replace_prob=0.0, mask_prob=0.0)
    # row 0: candidates [null, 2, 7]; row 1: none; row 2: [null, 1, 5], entity 9 (the third) dropped
    np.testing.assert_array_equal(out["entity_candidate_mask"], [[1, 1, 1], [1, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(out["entity_candidates"][0], [[0, 0, 0], vectors[2], vectors[7]])
    np.testing.assert_array_equal(out["entity_candidates"][2], [[0, 0, 0], vectors[1], vectors[5]])
    np.testing.assert_array_equal(out["entity_labels"], [[0, 2, 0, 1, 2, 0], [0] * 6, [0, 2, 0, 1, 0, 0]])
    np.testing.assert_array_equal(out["entity_weights"], [[0, 1, 0, 1, 1, 0], [0] * 6, [0, 1, 0, 1, 0, 0]])
    np.testing.assert_array_equal(out["entity_mask"], out["entity_weights"])
    np.testing.assert_array_equal(out["entity_vectors"][0, 1], vectors[7])
    # at the paper's rates: 5% of the aligned entities replaced, 15% masked, the rest kept
    ids = np.tile(np.arange(200) % 50, (100, 1))
    out = entity_inputs(ids, np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32),
                        np.random.default_rng(2), max_entities=50)
    vectors = np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32)
    kept = np.all(out["entity_vectors"] == vectors[ids], axis=-1)
    masked = out["entity_mask"] == 0
    assert abs(masked.mean() - 0.15) < 0.01 and abs(1 - kept.mean() - masked.mean() - 0.05 * 49 / 50) < 0.01


def _attention(x, keys, p, heads):
    """BertSelfAttention + BertSelfOutput (thunlp/ERNIE), eval mode."""
    b, n, h = x.shape
    def proj(name):
        return (x @ p[name]["kernel"].reshape(h, -1) + p[name]["bias"].reshape(-1)).reshape(b, n, heads, -1)
    q, k, v = proj("query"), proj("key"), proj("value")
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]) + np.where(keys, 0.0, -1e9)[:, None, None]
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, n, h)
    out = ctx @ p["output"]["kernel"].reshape(h, h) + p["output"]["bias"]
    return np_layer_norm(x + out, p["norm"])


def _perturbed(module, *args):
    """`module`'s parameters for `args`: LayerNorm scales 1, everything else 0 (flax's start, the
    kernels' small draws aside), every entry, biases and norms too, moved by N(0, 0.3): a swapped or
    missed tensor shows. The shapes come from `eval_shape`, so no initialiser is compiled."""
    shapes = nn.meta.unbox(jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *args))["params"])
    rng = np.random.default_rng(7)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (float(path[-1].key == "scale") + 0.3 * rng.normal(size=x.shape)).astype(np.float32), shapes)


def test_aggregator_matches_the_reference_layer_in_numpy():
    """thunlp/ERNIE's BertLayer: both attentions, ent * ent_mask, BertIntermediate (h = GELU(W_t w + W_e e + b)),
    BertOutput (LN(W h + b + w), LN_ent(W_e h + b_e + e))."""
    cfg = Config(vocab_size=50, hidden_size=8, num_heads=2, intermediate_size=12, entity_size=6, entity_heads=3,
                 knowledge_layers=1, num_layers=1)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(2, 5, 8)).astype(np.float32)
    e = rng.normal(size=(2, 5, 6)).astype(np.float32)
    input_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    present = np.array([[1, 0, 1, 1, 0], [1, 1, 0, 0, 0]], bool)
    layer = Aggregator(cfg)
    args = (jnp.asarray(w), jnp.asarray(e), Mask(keys=jnp.asarray(input_mask)), jnp.asarray(present[..., None]), True)
    params = _perturbed(layer, *args)
    got_w, got_e = jax.jit(lambda p: layer.apply({"params": p}, *args))(params)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    a_w = _attention(w.astype(np.float64), input_mask, p["attention"], 2)
    a_e = _attention(e.astype(np.float64), present, p["entity_attention"], 3) * present[..., None]
    h = np_gelu(a_w @ p["fusion"]["kernel"] + p["fusion"]["bias"] + a_e @ p["fusion_entity"]["kernel"]
              + p["fusion_entity"]["bias"])
    want_w = np_layer_norm(h @ p["output"]["kernel"] + p["output"]["bias"] + a_w, p["norm"])
    want_e = np_layer_norm(h @ p["entity_output"]["kernel"] + p["entity_output"]["bias"] + a_e, p["entity_norm"])
    np.testing.assert_allclose(np.asarray(got_w), want_w, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_e), want_e, atol=1e-5)
    # an unaligned token's fusion sees no entity: only the bias b̃ = b_t + b_e joins W̃_t w̃
    assert np.abs(a_e[0, 1]).max() == 0


def test_dea_loss_matches_numpy():
    """BertEntPredictionHead (Dense H -> d, GELU, LayerNorm, · candidates) and CrossEntropy(ignore_index=-1)."""
    cfg = Config(vocab_size=50, hidden_size=8, num_heads=2, intermediate_size=12, entity_size=6, entity_heads=3,
                 knowledge_layers=1, num_layers=1)
    rng = np.random.default_rng(3)
    seq = rng.normal(size=(2, 4, 8)).astype(np.float32)
    cand = rng.normal(size=(2, 3, 6)).astype(np.float32)
    cand_mask = np.array([[1, 1, 1], [1, 1, 0]], np.int32)
    labels = np.array([[0, 2, 1, 0], [1, 0, 0, 1]], np.int32)
    weights = np.array([[0, 1, 1, 0], [1, 0, 0, 1]], np.float32)
    head = EntityHead(cfg)
    params = _perturbed(head, seq, cand, cand_mask)
    logits = jax.jit(lambda p: head.apply({"params": p}, seq, cand, cand_mask))(params)
    got = divided(dea_means(logits, jnp.asarray(labels), jnp.asarray(weights)))
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    x = np_layer_norm(np_gelu(seq @ p["transform"]["kernel"] + p["transform"]["bias"]), p["norm"])
    scores = np.einsum("bld,bkd->blk", x, cand)
    scores = np.where(cand_mask[:, None] > 0, scores, -np.inf)
    logp = scores - np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        scores.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    assert float(got["dea_loss"]) == pytest.approx((nll * weights).sum() / (weights.sum() + 1e-5), rel=1e-5)


def test_bad_graph_files_stop_with_one_line(tmp_path):
    knowledge.write_graph(tmp_path, ["a.b", "a"], np.ones((2, 3), np.float32), [("a.b", 0)], np.array([[0, 1, 0]]))
    assert knowledge.read_graph(tmp_path).names == ("a.b", "a")
    (tmp_path / "entity2vec.vec").write_text("1\t2\t3\n1\tx\t3\n")
    with pytest.raises(UserError, match=r"entity2vec.vec:2: expected tab-separated floats") as e:
        knowledge.read_graph(tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "entity2vec.vec").write_text("1\t2\t3\n1\t2\n")
    with pytest.raises(UserError, match=r"entity2vec.vec:2: 2 numbers where line 1 has 3"):
        knowledge.read_graph(tmp_path)
    (tmp_path / "entity2id.txt").write_text("2\na.b\t0\na\t0\n")
    with pytest.raises(UserError, match=r"entity2id.txt:3: id 0 is given twice"):
        knowledge.read_graph(tmp_path)


def test_the_model_block_records_the_graph_that_data_kg_names(tmp_path):
    """Fine-tuning sees only a run's model block, so `model.kg` records the graph: the preset ties it
    to data.kg, and a config whose two differ is refused in one line."""
    import helpers

    from bertology import validation

    knowledge.write_graph(tmp_path, ["a.b"], np.ones((1, 100), np.float32), [("a.b", 0)], np.zeros((0, 3), np.int64))
    c = helpers.config("ernie_kg", "tiny")
    c.data.kg = str(tmp_path)
    assert c.model.kg == str(tmp_path)
    validation.check(c)
    c.model = ml_collections.ConfigDict({**c.model.to_dict(), "kg": "embedded"})
    with pytest.raises(UserError, match=rf"model.kg='embedded' is not data.kg='{tmp_path}'.*--config.model.kg="):
        validation.check(c)


def test_layer_index_places_the_aggregators_after_the_text_layers():
    assert layer_index(("embeddings", "token", "embedding")) == -1
    assert layer_index(("ffn_0", "intermediate", "kernel")) == 0
    assert layer_index(("knowledge_1", "entity_attention", "query", "kernel")) == 1
    assert layer_index(("pooler", "kernel")) is None


def test_task_rows_read_the_entities_of_their_mentions(tmp_path, monkeypatch):
    """`task_inputs` aligns task rows (a choice task's [rows, choices, length] too) with the run's
    graph `model.kg` as pretraining aligns its rows, and carries each entity's own vector, uncorrupted.
    The graph is read once for every split, and again once its files change."""
    from bertology.families.ernie_kg import model as ernie_model

    ernie_model._aligner.cache_clear()
    reads = []
    monkeypatch.setattr(knowledge, "read_graph", lambda d, read=knowledge.read_graph: reads.append(d) or read(d))
    tok = load_tokenizer(embedded.DEFAULT_VOCAB)
    vectors = np.arange(1, 13, dtype=np.float32).reshape(4, 3)
    knowledge.write_graph(tmp_path, ["json", "json.dumps", "io.TextIOWrapper", "os"], vectors,
                          [("json.dumps", 1), ("TextIOWrapper", 2), ("json", 0)], np.zeros((0, 3), np.int64))
    cfg = Config(vocab_size=tok.vocab_size, entity_size=3, entity_heads=1, kg=str(tmp_path))
    rows = stack([encode_pair(tok, "json.dumps a TextIOWrapper", "see json", 12), encode_pair(tok, "os here", "", 12)])
    # [CLS] json . dumps a textiowrapper [SEP] see json [SEP] [PAD] [PAD]; "os" is no mention
    assert [tok.decode([i]) for i in rows["input_ids"][0, 1:6]] == ["json", ".", "dumps", "a", "textiowrapper"]
    out = task_inputs(cfg, tok, rows, "classification")
    entity = np.full((2, 12), -1)
    entity[0, [1, 5, 8]] = [1, 2, 0]  # json.dumps beats json; json before [SEP] ends at a word boundary
    np.testing.assert_array_equal(out["entity_mask"], entity >= 0)
    np.testing.assert_array_equal(out["entity_vectors"][0, [1, 5, 8]], vectors[[1, 2, 0]])
    assert out["entity_vectors"].shape == (2, 12, 3) and np.abs(out["entity_vectors"][entity < 0]).max() == 0
    assert set(out) == set(rows) | {"entity_vectors", "entity_mask"}
    choices = task_inputs(cfg, tok, {k: v[None] for k, v in rows.items()}, "multiple_choice")
    for key in ("entity_vectors", "entity_mask"):
        np.testing.assert_array_equal(choices[key], out[key][None])
    assert len(reads) == 1
    knowledge.write_graph(tmp_path, ["json", "json.dumps", "io.TextIOWrapper", "os"], -vectors,
                          [("json.dumps", 1), ("TextIOWrapper", 2), ("json", 0)], np.zeros((0, 3), np.int64))
    np.testing.assert_array_equal(task_inputs(cfg, tok, rows, "classification")["entity_vectors"], -out["entity_vectors"])
    assert len(reads) == 2


# a slice of the embedded example: these packages' modules, classes and functions and their docstrings
PACKAGES = ("email", "json", "concurrent")
PLAIN = ("it", "this", "that", "something", "nothing", "everything", "one", "each")  # no mentions
ENTITY_SIZE = 8  # the fixture graph's TransE width: the model is sized for speed, not the paper


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny pretraining run on a slice of the embedded example: (its workdir, config, metrics rows,
    the graph's entity and triple counts)."""
    import helpers

    from bertology.train.loop import train

    root = embedded.stdlib_root()
    sources = [s for s in embedded.stdlib_sources(root) if s.relative_to(root).parts[0] in PACKAGES]
    tmp = tmp_path_factory.mktemp("ernie_kg")
    names, mentions, triples = knowledge.stdlib_graph(sources)
    knowledge.write_graph(tmp / "kg", names, knowledge.transe(triples, len(names), 2, dim=ENTITY_SIZE, epochs=30),
                          mentions, triples)
    sentences = embedded.stdlib_sentences()
    docs = ["\n".join(sentences[s.relative_to(root).as_posix()]) for s in sources]
    (tmp / "corpus.txt").write_text("\n\n".join(d for d in docs if d) + "\n")
    c = helpers.config("ernie_kg", "tiny")
    c.batch_size, c.total_steps, c.log_every, c.eval_every, c.checkpoint_every = 8, 20, 1, 0, 1000
    c.model.update(hidden_size=32, num_heads=2, intermediate_size=64, entity_size=ENTITY_SIZE, entity_heads=2,
                   dropout_rate=0.0, attention_dropout_rate=0.0)
    c.data.update(corpus=str(tmp / "corpus.txt"), kg=str(tmp / "kg"), max_seq_length=64, max_predictions_per_seq=10)
    c.optimizer.update(learning_rate=5e-3, warmup_steps=4)
    c.mesh.shape = (1, 1)
    train(c, tmp / "run")
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return tmp / "run", c, [r for r in rows if "loss" in r], len(names), len(triples)


def test_tiny_run_on_the_embedded_example_lowers_its_loss(run):
    workdir, c, rows, entities, triples = run
    assert entities > 40 and triples > 40
    for key in ("loss", "mlm_loss"):
        first, last = np.mean([r[key] for r in rows[:4]]), np.mean([r[key] for r in rows[-4:]])
        assert last < first - 0.3, (key, first, last)
    dea = [r["dea_loss"] for r in rows if r["dea_loss"] > 0]  # a batch without an aligned entity has no dEA term
    assert np.mean(dea[-5:]) < np.mean(dea[:3]), dea
    for r in rows:
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["nsp_loss"] + r["dea_loss"], rel=1e-5)
    # the model block records the graph the run aligned, for fine-tuning (the preset ties it to data.kg)
    assert json.loads((workdir / "config.json").read_text())["model"]["kg"] == c.data.kg


def test_fine_tuning_reads_the_entities_of_the_task_text(run, tmp_path):
    """The fine-tuning driver starts a classifier from the run's checkpoint (its trunk is the
    pretraining model's `trunk(params)`) and lowers its loss telling rows that name the run's
    entities from rows that name none; the trained classifier's logits for a row move when its
    entities are taken away. They move little (the head of a model this small, trained for 20 steps,
    reads mostly the tokens), but identical rows give bit-equal logits, so the move is the
    entities', not rounding."""
    from bertology.train.finetune import default_config, finetune

    workdir, c, *_ = run
    pretrained = json.loads((workdir / "config.json").read_text())
    tok = for_data(pretrained["data"])
    named = [text for text, _ in knowledge.read_graph(c.data.kg).mentions][:8]
    lines = [f"{text} is here .\t1" for text in named] + [f"{word} is here .\t0" for word in PLAIN]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    (data / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(lines[::4]) + "\n")
    ft = default_config("sst2")
    ft.update(init_checkpoint=str(workdir), total_steps=20, batch_size=8, eval_batch_size=8, log_every=1)
    ft.data.update(dir=str(data), max_seq_length=24)
    ft.optimizer.learning_rate = 1e-2
    ft.mesh.shape = (1, 1)
    result = finetune(ft, tmp_path / "finetune")
    loss = np.array(result["train_loss"])
    assert loss[-5:].mean() < loss[:5].mean() - 0.2, loss

    cfg = models.encoder_config(pretrained["model"])
    rows = task_inputs(cfg, tok, stack([encode_pair(tok, " and ".join(named[:4]), "", 24)]), "classification")
    assert rows["entity_mask"].sum() >= 3
    bare = {**rows, "entity_vectors": np.zeros_like(rows["entity_vectors"]),
            "entity_mask": np.zeros_like(rows["entity_mask"])}
    batch = {k: np.concatenate([rows[k], bare[k], bare[k]]) for k in rows}
    task = TaskModel(cfg, "classification", 2, family="ernie_kg")
    logits = np.asarray(jax.jit(lambda p: task.apply({"params": p}, batch)["logits"])(result["params"]))
    np.testing.assert_array_equal(logits[1], logits[2])
    assert np.abs(logits[0] - logits[1]).max() > 1e-5, logits
