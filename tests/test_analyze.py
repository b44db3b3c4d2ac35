"""`bertology.analyze similarity` (Ethayarajh 2019): the word's pieces are found in WordPiece and
byte-level BPE text; self-similarity and anisotropy are numpy's cosines over the trunk's layers;
a layer that cannot see the context gives self-similarity 1 (BERT's embeddings for a word at the
same position, every layer of a causal GPT for a sentence's first word); the CLI writes its json
and plot; bad input is one line.

`bertology.analyze attention` (Clark et al. 2019): the maps are transformers' `output_attentions`
of the exported run (BERT, GPT-2); shared (ALBERT), scanned and MobileBERT stacks give one
normalised map per layer; the per-head statistics are those hand-computed on made-up maps; a
family with attention of its own (XLNet) is refused in one line."""

import functools
import json

import flax.linen as nn
import helpers
import jax
import numpy as np
import pytest

from bertology import analyze, models
from bertology.analysis import attention, probe, similarity
from bertology.data.tokenizers import for_data
from bertology.errors import UserError
from bertology.features import attention_maps, layer_states

SAME_START = ["broke the vase on the floor .", "broke the news to the family .", "broke the record at the games ."]
MIDDLE = ["the vase broke on the floor .", "she broke the news gently .", "he finally broke the record ."]


def _run(tmp_path, family, scale=20):
    """A random-weight run of `family`'s tiny preset (BERT: WordPiece; GPT: byte-level BPE), its
    weights `scale` x the initial ones."""
    config = helpers.config(family, "tiny")
    config.model.update(vocab_size=for_data(config.data).vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                        intermediate_size=64)
    model = models.build(config.model)
    batch = {k: np.zeros((1, 8), np.int32) for k in ("input_ids", "segment_ids", "masked_positions")}
    batch["input_mask"] = np.ones((1, 8), np.int32)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch)["params"])
    # weights 20x the initial scale: at init's 0.02 the residual stream is all embedding, so the
    # attention layers would barely move a vector (self-similarity 0.99999 in every layer)
    params = jax.tree.map(lambda x: np.asarray(x) * scale, params)
    return helpers.write_run(tmp_path / family, config, params), config


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_word_pieces_are_the_words_tokens(family):
    tokenizer = for_data(helpers.config(family, "tiny").data)
    for text, word in [("the vase broke on the floor .", "broke"), ("unbreakable records broke", "broke"),
                       ("a broken-hearted reader", "broken"), ("Broke again", "broke")]:
        ids = tokenizer.encode(text)
        pieces = similarity.word_pieces(tokenizer, text, word)
        assert tokenizer.decode(ids[pieces.start:pieces.stop]).strip().lower() == word
    with pytest.raises(ValueError):
        similarity.word_pieces(tokenizer, "unbreakable", "break")  # inside another word: not the word


def test_similarity_is_numpys_cosines_and_the_embeddings_ignore_context(tmp_path):
    run, config = _run(tmp_path, "bert")
    result = similarity.self_similarity(run, SAME_START + MIDDLE, "broke", max_seq_length=16)
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
    first = similarity.self_similarity(run, SAME_START, "broke", max_seq_length=16)["layers"]
    assert first[0]["self_similarity"] == pytest.approx(1.0, abs=1e-6)
    assert first[-1]["self_similarity"] < 1 - 1e-3  # the attention layers read the rest of the sentence


def test_a_causal_trunk_keeps_a_first_word_context_free_in_every_layer(tmp_path):
    run, _ = _run(tmp_path, "gpt")
    layers = similarity.self_similarity(run, SAME_START, "broke", max_seq_length=16)["layers"]
    assert len(layers) == 3 and all(r["self_similarity"] == pytest.approx(1.0, abs=1e-5) for r in layers)
    later = similarity.self_similarity(run, MIDDLE, "broke", max_seq_length=16)["layers"]
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
        similarity.self_similarity(run, ["the vase broke ."], "broke")


# --- attention maps -----------------------------------------------------------------------------

def test_head_statistics_are_the_hand_computed_means():
    """[CLS] a , b [SEP] [PAD]: head 0 looks at [CLS] only, head 1 uniformly at the 5 real tokens,
    head 2 at the previous token ([CLS] at itself). Means over the 5 real queries; previous/next
    over the 4 queries that have a real neighbour there."""
    ids = np.array([[2, 10, 11, 12, 3, 0]])
    mask = (ids > 0).astype(np.int32)
    p = np.zeros((1, 1, 3, 6, 6))
    p[0, 0, 0, :5, 0] = 1
    p[0, 0, 1, :5, :5] = 0.2
    p[0, 0, 2, 0, 0] = 1
    for q in range(1, 5):
        p[0, 0, 2, q, q - 1] = 1
    stats = attention.HeadStatistics(cls_id=2, sep_id=3, punctuation=lambda x: x == 11)
    stats.add(p, ids, mask)
    stats.add(p, ids, mask)  # a second batch leaves the means alone
    got = {k: np.array(v)[0] for k, v in stats.result().items()}
    close = functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7)  # float32 sums within a batch
    close(got["cls"], [1, 0.2, 2 / 5])  # head 2: [CLS] from itself and from `a`
    close(got["sep"], [0, 0.2, 0])  # only the padding query would follow [SEP]
    close(got["punctuation"], [0, 0.2, 1 / 5])  # `b` looks at `,`
    close(got["previous"], [1 / 4, 0.2, 1])  # head 0: only `a`'s previous is [CLS]
    close(got["next"], [0, 0.2, 0])
    close(got["entropy"], [0, np.log(5), 0])


def _maps(run, texts, length=16):
    batches = list(attention_maps(run, texts, max_seq_length=length, batch_size=2))  # several batches
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_maps_are_transformers_output_attentions(family, tmp_path):
    """Our run exported to Hugging Face (BertModel, GPT2Model): its `output_attentions` at every
    real query are our maps, padding keys and queries zero."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bertology.interop import export_hf

    run, _ = _run(tmp_path, family, scale=4)  # at 20x every head is one-hot, at 1x near uniform
    ours = _maps(run, MIDDLE + SAME_START[:1])
    (out,) = export_hf(run, tmp_path / "hf")
    hf = transformers.AutoModel.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ours["input_ids"]).long(),
                    attention_mask=torch.tensor(ours["input_mask"]).long(), output_attentions=True).attentions
    theirs = np.stack([a.numpy() for a in theirs], 1)  # [b, layers, heads, L, L]
    assert ours["attention"].shape == theirs.shape == (4, 2, 2, 16, 16)
    real = ours["input_mask"] > 0
    for i, n in enumerate(real.sum(1)):
        np.testing.assert_allclose(ours["attention"][i, :, :, :n], theirs[i, :, :, :n], atol=2e-5, rtol=0)
        assert not ours["attention"][i, :, :, n:].any() and not ours["attention"][i, ..., n:].any()
    if family == "gpt":  # causal: nothing above the diagonal
        assert not np.triu(ours["attention"], 1).any()
    rows = ours["attention"].max(-1)[np.broadcast_to(real[:, None, None], ours["attention"].shape[:4])]
    print(f"\nrows whose largest probability is below 0.9: {np.mean(rows < 0.9):.2f}, above 0.5: {np.mean(rows > 0.5):.2f}")
    assert np.mean(rows < 0.9) > 0.25  # not one-hot rows: the comparison sees the softmax's values


@pytest.mark.parametrize("family, edits, layers", [("albert", {}, 2), ("bert", {"scan_layers": True}, 2),
                                                   ("mobilebert", {}, 2)])
def test_every_stack_layout_gives_one_normalised_map_per_layer(family, edits, layers, tmp_path):
    config = helpers.config(family, "tiny")
    config.model.update(vocab_size=for_data(config.data).vocab_size, num_layers=layers, **edits)
    config.data.max_seq_length = 16
    run = helpers.write_run(tmp_path / "run", config, helpers.random_params(config))
    maps = _maps(run, MIDDLE)
    assert maps["attention"].shape[:3] == (3, layers, config.model.num_heads)
    rows = np.broadcast_to(maps["input_mask"][:, None, None, :], maps["attention"].shape[:4])
    np.testing.assert_allclose(maps["attention"].sum(-1), rows, atol=1e-5)  # 1 at real queries, 0 at padding
    assert not (maps["attention"] * (1 - maps["input_mask"][:, None, None, None, :])).any()  # padding keys: 0
    if family == "albert":  # one shared layer applied twice: the second application sees other inputs
        assert np.abs(maps["attention"][:, 0] - maps["attention"][:, 1]).max() > 1e-4


def test_cli_writes_statistics_and_plots_and_refuses_in_one_line(tmp_path, capsys):
    run, _ = _run(tmp_path, "bert")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(MIDDLE) + "\n")
    assert analyze.main(["attention", f"--checkpoint={run}", f"--input={sentences}", f"--out={tmp_path / 'out'}",
                         "--max_seq_length=16", "--show=2"]) == 0
    saved = json.loads((tmp_path / "out" / "attention.json").read_text())
    assert (saved["sentences"], saved["layers"], saved["heads"]) == (3, 2, 2)
    stats = {k: np.array(v) for k, v in saved["statistics"].items()}
    assert set(stats) == set(attention.STATISTICS) and all(v.shape == (2, 2) for v in stats.values())
    longest = max(len(for_data(helpers.config("bert", "tiny").data).encode(t)) + 2 for t in MIDDLE)
    assert (stats["entropy"] >= 0).all() and (stats["entropy"] <= np.log(longest) + 1e-9).all()
    for name in ("attention_heads.png", "attention_sentence2.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert analyze.main(["attention", f"--checkpoint={run}", f"--input={sentences}", "--show=4"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "bertology.analyze: error: --show=4 but there are 3 sentences; pick one of 1..3"

    config = helpers.config("xlnet", "tiny")
    config.model.vocab_size = for_data(config.data).vocab_size
    config.data.max_seq_length = 16
    xlnet = helpers.write_run(tmp_path / "xlnet", config, helpers.random_params(config))
    assert analyze.main(["attention", f"--checkpoint={xlnet}", f"--input={sentences}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("bertology.analyze: error: a xlnet run's attention is not the shared softmax attention")


# --- probing classifiers --------------------------------------------------------------------------

CLASSES = {"the": "DET", "a": "DET", "cat": "NOUN", "dog": "NOUN", "house": "NOUN", "tree": "NOUN", "sat": "VERB",
           "ran": "VERB", "red": "ADJ", "big": "ADJ", "small": "ADJ", "on": "ADP"}


def _tagged(path, n, seed, tag):
    """A CoNLL-style file of n random 6-word sentences over CLASSES' words, `tag(word, rng)` each."""
    rng = np.random.default_rng(seed)
    words = sorted(CLASSES)
    lines = ["-DOCSTART- -X- O", ""]
    for _ in range(n):
        for w in rng.choice(words, 6):
            lines.append(f"{w} X {tag(w, rng)}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_token_vectors_are_each_words_first_piece(tmp_path):
    """With a word cut into pieces: one vector per word, its first piece's, in order; the same
    vectors as the sentence read as text."""
    run, config = _run(tmp_path, "bert", scale=4)
    sentences, tags = [["the", "unbreakable", "cat"], ["a", "dog"]], [["A", "B", "C"], ["D", "E"]]
    x, labels, words = probe.vectors(run, "tokens", sentences, tags, 16)
    assert labels == ["A", "B", "C", "D", "E"] and words == ["the", "unbreakable", "cat", "a", "dog"]
    pieces = len(for_data(config.data).encode("unbreakable"))
    assert pieces > 1
    states = layer_states(run, [" ".join(s) for s in sentences], max_seq_length=16)
    for k, (i, at) in enumerate([(0, 1), (0, 2), (0, 2 + pieces), (1, 1), (1, 2)]):  # after [CLS]
        np.testing.assert_allclose(x[:, k], states["layers"][i, :, at], atol=1e-6, rtol=0)
    assert x.shape[0] == 3  # the embeddings and 2 layers


@pytest.mark.parametrize("tag, lowest, highest", [
    (lambda w, rng: CLASSES[w], 0.95, 1.0),  # the word's class: the embedding layer alone holds it
    (lambda w, rng: str(rng.integers(2)), 0.0, 0.65),  # a coin per token: nothing to read off any layer
])
def test_token_probe_reads_what_the_layer_holds_and_nothing_else(tag, lowest, highest, tmp_path):
    run, _ = _run(tmp_path, "bert", scale=4)
    train = probe.read_tokens(_tagged(tmp_path / "train.txt", 60, 0, tag), -1)
    test = probe.read_tokens(_tagged(tmp_path / "test.txt", 20, 1, tag), -1)
    result = probe.accuracy_by_layer(run, "tokens", train, test, max_seq_length=16)
    assert (result["train_examples"], result["test_examples"]) == (360, 120)
    print("\n" + " ".join(f"{r['accuracy']:.3f}/{r['control']:.3f}" for r in result["layers"]))
    assert lowest <= result["layers"][0]["accuracy"] <= highest
    for r in result["layers"]:
        assert r["selectivity"] == r["accuracy"] - r["control"]
        # the control task is a tag per word type: the embedding layer, which is word identity, holds it
    assert result["layers"][0]["control"] >= 0.9


def _sentences(path, n, seed):
    """A TSV of n random 5-word sentences over CLASSES' words, labelled by whether `cat` is in it."""
    rng = np.random.default_rng(seed)
    rows = [" ".join(rng.choice(sorted(CLASSES), 5)) for _ in range(n)]
    path.write_text("sentence\tlabel\n" + "".join(f"{r}\t{int('cat' in r.split())}\n" for r in rows))
    return path


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_sentence_probe_reads_the_features_sentence_vectors(family, tmp_path):
    """BERT's sentence vector is the mean of its tokens, GPT's its last token (`extract`'s)."""
    from bertology.features import extract

    run, _ = _run(tmp_path, family, scale=4)
    train = probe.read_sentences(_sentences(tmp_path / "train.tsv", 80, 0), "sentence", "label")
    test = probe.read_sentences(_sentences(tmp_path / "dev.tsv", 40, 1), "sentence", "label")
    x, labels, texts = probe.vectors(run, "sentences", *test, 16)
    assert labels == test[1] and texts == test[0]
    for layer in range(3):
        np.testing.assert_allclose(x[layer], extract(run, test[0], layers=(layer,), max_seq_length=16)["sentence"],
                                   atol=1e-5, rtol=0)
    result = probe.accuracy_by_layer(run, "sentences", train, test, max_seq_length=16)
    print("\n" + " ".join(f"{r['accuracy']:.3f}" for r in result["layers"]), f"majority {result['majority']:.3f}")
    assert "control" not in result["layers"][0]
    if family == "bert":  # a word's presence shifts the mean of the embeddings along its own vector
        assert result["layers"][0]["accuracy"] >= max(0.9, result["majority"] + 0.2)
    # (GPT's vector is its end token, which at the embeddings knows nothing of the words before it)


def test_probe_cli_writes_json_and_plot_and_refuses_in_one_line(tmp_path, capsys):
    run, _ = _run(tmp_path, "bert", scale=4)
    train = _tagged(tmp_path / "train.txt", 20, 0, lambda w, rng: CLASSES[w])
    test = _tagged(tmp_path / "test.txt", 5, 1, lambda w, rng: CLASSES[w])
    args = ["probe", f"--checkpoint={run}", "--kind=tokens", f"--out={tmp_path / 'out'}", "--max_seq_length=16"]
    assert analyze.main([*args, f"--train={train}", f"--test={test}"]) == 0
    saved = json.loads((tmp_path / "out" / "probe_tokens.json").read_text())
    assert saved["labels"] == sorted(set(CLASSES.values())) and len(saved["layers"]) == 3
    assert (tmp_path / "out" / "probe_tokens.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    test.write_text(test.read_text().replace(" ADP\n", " PRT\n"))
    assert analyze.main([*args, f"--train={train}", f"--test={test}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("bertology.analyze: error: test label(s) ['PRT'] never occur in the training file; a probe "
                    "cannot predict them: give a training file with every label")
    assert analyze.main([*args, f"--train={train}", f"--test={test}", "--column=5"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"bertology.analyze: error: {train}:3: ") and line.endswith("fix --column")


# --- training curves ------------------------------------------------------------------------------

def _metrics(run, rows):
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_curves_read_each_step_as_the_run_left_it_and_smooth_them(tmp_path, capsys):
    """A run resumed from step 2 rewrote steps 3-4 (the later rows win); evaluation rows without
    the metric are skipped; the moving average is numpy's over the window."""
    from bertology.analysis import curves

    a = _metrics(tmp_path / "a", [{"step": s, "time": 0, "loss": 10.0 - s} for s in range(1, 5)]
                 + [{"step": 4, "time": 1, "eval_accuracy": 0.5}]
                 + [{"step": s, "time": 2, "loss": 20.0 + s} for s in (3, 4, 5)])
    b = _metrics(tmp_path / "b", [{"step": s, "time": 0, "loss": 1.0 / s} for s in range(1, 4)])
    read = curves.read({"resumed": a, "other": b}, "loss")
    assert read["resumed"] == {"steps": [1, 2, 3, 4, 5], "values": [9.0, 8.0, 23.0, 24.0, 25.0]}
    assert read["other"]["values"] == [1.0, 0.5, 1 / 3]
    values = read["resumed"]["values"]
    want = [np.mean(values[max(0, i - 2):i + 1]) for i in range(len(values))]
    np.testing.assert_allclose(curves.moving_average(values, 3), want)
    assert analyze.main(["curves", "--runs", f"resumed={a}", f"other={b}", "--smooth=3"]) == 0
    saved = json.loads((a / "analysis" / "curves_loss.json").read_text())
    assert saved["summary"]["resumed"] == {"first": 9.0, "last": 24.0, "steps": 5}
    assert (a / "analysis" / "curves_loss.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert analyze.main(["curves", "--runs", f"resumed={a}", "--metric=accuracy"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"bertology.analyze: error: run resumed ({a}) never logged 'accuracy'; it logged eval_accuracy, loss"
    assert analyze.main(["curves", "--runs", str(a)]) == 2
    assert "is not LABEL=WORKDIR" in capsys.readouterr().err


# --- loss surfaces ---------------------------------------------------------------------------------

def test_loss_surfaces_are_the_training_loss_from_start_to_end_and_around_it(pretrained, tmp_path, capsys):
    """A tiny BERT fine-tuned on the SST-2 fixture: the line's end is numpy's cross-entropy of the
    run's final model over its training rows; its start holds the pretrained trunk and is worse;
    the plane's centre is the end; the directions keep each column's norm; the CLI writes its
    files and refuses a pretraining run in one line."""
    from bertology.analysis import surface
    from bertology.train.checkpoint import load_params

    run = tmp_path / "ft"
    helpers.sst2_from(pretrained, run, steps=20, max_seq_length=32, drop=0.05)
    result = surface.surfaces(run, points=4, grid=1, span=0.5)
    assert result["alphas"] == [-0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25] and result["coordinates"] == [-0.5, 0.0, 0.5]
    line = dict(zip(result["alphas"], result["line"]))
    start, end, model, _, batches = surface.endpoints(run)
    logits = np.concatenate([np.asarray(model.apply({"params": end}, b, deterministic=True)["logits"]) for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(1, keepdims=True)
    assert line[1.0] == pytest.approx(-logp[np.arange(len(labels)), labels].mean(), rel=1e-5)
    assert result["training_rows"] == len(labels) == 10
    assert line[0.0] > line[1.0] + 0.05  # fine-tuning lowered the training loss
    trunk = load_params(pretrained)[0]["encoder"]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start["encoder"]), jax.tree.leaves(trunk)))
    assert result["plane"][1][1] == line[1.0]
    d = surface.filter_normalised(end, 0)
    for x, u in zip(jax.tree.leaves(end), jax.tree.leaves(d)):
        x = np.asarray(x, np.float64)
        if x.ndim < 2:
            assert not u.any()
        else:
            axes = tuple(range(x.ndim - 1))
            np.testing.assert_allclose(np.linalg.norm(u, axis=axes), np.linalg.norm(x, axis=axes), rtol=1e-9)
    assert analyze.main(["surface", f"--checkpoint={run}", "--points=2", "--grid=1"]) == 0
    for name in ("surface.json", "surface_1d.png", "surface_2d.png"):
        assert (run / "analysis" / name).stat().st_size > 0
    capsys.readouterr()
    assert analyze.main(["surface", f"--checkpoint={pretrained}"]) == 2
    (line_,) = capsys.readouterr().err.strip().splitlines()
    assert line_.startswith("bertology.analyze: error: ") and "is a pretraining run" in line_
