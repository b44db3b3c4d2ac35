"""Data transforms: causal and prefix-LM rows against a direct construction from the documents,
the prefix split's distribution, determinism and exact resume, the registry, and the MLM
transform reproducing the pipeline's original recipe bit for bit."""

import types

import ml_collections
import numpy as np
import pytest
from scipy import stats

from bertology.data import transforms
from bertology.data.examples import create_pair_instances
from bertology.data.masking import mask_tokens
from bertology.data.pipeline import PretrainingStream, eval_batches
from bertology.errors import UserError

EOS = 5
TOK = types.SimpleNamespace(vocab_size=1000, pad_id=0, cls_id=2, sep_id=3, mask_id=4, unk_id=1, eos_id=EOS,
                            special_ids=frozenset({0, 1, 2, 3, 4, 5}))


def docs(n=30, seed=0, longest=60):
    """Documents of 1-5 sentences (some empty), one with no tokens, several longer than a row."""
    rng = np.random.default_rng(seed)
    out = [[rng.integers(10, 1000, rng.integers(0, longest // 3)).astype(np.int32) for _ in range(rng.integers(1, 6))]
           for _ in range(n)]
    out[3] = [np.zeros(0, np.int32)]
    return out


def cfg(**kw):
    fields = dict(max_seq_length=16, max_predictions_per_seq=5, masked_lm_prob=0.15, short_seq_prob=0.1,
                  masking="static", dupe_factor=3)
    fields.update(kw)
    return ml_collections.ConfigDict(fields)


def reference_pieces(documents, length):
    """Each document + EOS as windows of `length` tokens, each window starting on the previous
    one's last token, until a window reaches the end."""
    out = []
    for doc in documents:
        seq = [int(t) for s in doc for t in s] + [EOS]
        if len(seq) == 1:
            continue
        start = 0
        while True:
            out.append(tuple(seq[start : start + length]))
            if start + length >= len(seq):
                break
            start += length - 1
    return out


def take(stream, n):
    return [next(stream) for _ in range(n)]


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_causal_rows_are_packed_pieces_with_next_token_targets():
    documents = docs()
    rows = transforms.make(cfg(objective="causal"), TOK).instances(documents, np.random.default_rng(0))
    assert set(rows) == {"input_ids", "input_mask", "positions", "packing_ids", "targets", "target_weights"}
    ids, pid = rows["input_ids"], rows["packing_ids"]
    expected = {k: np.zeros_like(v) for k, v in rows.items() if k != "input_ids"}
    found = []
    for r in range(len(ids)):
        at = 0
        for k in range(1, pid[r].max() + 1):  # pieces 1, 2, ... lie back to back from position 0
            n = int((pid[r] == k).sum())
            found.append(tuple(ids[r, at : at + n]))
            expected["packing_ids"][r, at : at + n] = k
            expected["input_mask"][r, at : at + n] = 1
            expected["positions"][r, at : at + n] = np.arange(n)
            expected["targets"][r, at : at + n - 1] = ids[r, at + 1 : at + n]
            expected["target_weights"][r, at : at + n - 1] = 1
            at += n
        assert (ids[r, at:] == TOK.pad_id).all()
    assert sorted(found) == sorted(reference_pieces(documents, 16))
    assert max(map(len, found)) == 16 and len(ids) < len(found)  # long documents cut; rows hold several pieces
    for k, v in expected.items():
        np.testing.assert_array_equal(rows[k], v, err_msg=k)
    # The overlap keeps every target: each document's tokens after its first are predicted once.
    predicted = rows["target_weights"].sum()
    assert predicted == sum(sum(map(len, d)) for d in documents if sum(map(len, d)))


def test_prefix_lm_rows_predict_only_after_the_prefix():
    documents = docs()
    rows = transforms.make(cfg(objective="prefix_lm"), TOK).instances(documents, np.random.default_rng(0))
    assert set(rows) == {"input_ids", "input_mask", "positions", "targets", "target_weights", "prefix_length"}
    ids, prefix = rows["input_ids"], rows["prefix_length"]
    n = rows["input_mask"].sum(1)
    assert sorted(tuple(ids[r, : n[r]]) for r in range(len(ids))) == sorted(reference_pieces(documents, 16))
    assert ((1 <= prefix) & (prefix <= n - 1)).all()  # a prefix and at least one target in every row
    targets, weights, positions = (np.zeros_like(rows[k]) for k in ("targets", "target_weights", "positions"))
    for r in range(len(ids)):
        assert (rows["input_mask"][r] == (np.arange(16) < n[r])).all() and (ids[r, n[r]:] == TOK.pad_id).all()
        positions[r, : n[r]] = np.arange(n[r])
        targets[r, prefix[r] - 1 : n[r] - 1] = ids[r, prefix[r] : n[r]]
        weights[r, prefix[r] - 1 : n[r] - 1] = 1
    np.testing.assert_array_equal(rows["positions"], positions)
    np.testing.assert_array_equal(rows["targets"], targets)
    np.testing.assert_array_equal(rows["target_weights"], weights)


def test_prefix_split_is_uniform_and_fresh_every_pass():
    rng = np.random.default_rng(1)
    documents = [[rng.integers(10, 1000, 8).astype(np.int32)] for _ in range(4000)]  # + EOS: 9 tokens
    transform = transforms.make(cfg(objective="prefix_lm", max_seq_length=9), TOK)
    a = transform.instances(documents, np.random.default_rng([0, 1, 0]))["prefix_length"]
    b = transform.instances(documents, np.random.default_rng([0, 1, 1]))["prefix_length"]
    counts = np.bincount(a, minlength=10)
    assert counts[0] == counts[9] == 0 and (counts[1:9] > 0).all()  # only 1 ... n-1 = 8
    assert stats.chisquare(counts[1:9]).pvalue > 1e-3  # uniform over 1 ... 8
    assert abs((a == b).mean() - 1 / 8) < 0.03  # another pass splits the same pieces independently


@pytest.mark.parametrize("objective", ["causal", "prefix_lm"])
def test_lm_streams_are_deterministic_and_resume_exactly(objective):
    documents = docs(12)
    a = take(PretrainingStream([documents], TOK, cfg(objective=objective), batch_size=8, seed=1), 20)
    b = take(PretrainingStream([documents], TOK, cfg(objective=objective), batch_size=8, seed=1), 20)
    c = take(PretrainingStream([documents], TOK, cfg(objective=objective), batch_size=8, seed=2), 20)
    assert all(same(x, y) for x, y in zip(a, b))
    assert not all(same(x, y) for x, y in zip(a, c))
    s = PretrainingStream([documents], TOK, cfg(objective=objective), batch_size=8, seed=0)
    take(s, 13)
    state = s.get_state()
    assert state["corpora"][0]["pass"] >= 2  # resuming across pass boundaries
    expected = take(s, 10)
    r = PretrainingStream([documents], TOK, cfg(objective=objective), batch_size=8, seed=0)
    r.set_state(state)
    assert all(same(x, y) for x, y in zip(expected, take(r, 10)))
    evals = eval_batches([documents], TOK, cfg(objective=objective), batch_size=4, num_batches=2, seed=0)
    assert len(evals) == 2 and evals[0].keys() == a[0].keys() and evals[0]["input_ids"].shape == (4, 16)


def test_unknown_names_are_one_line_user_errors():
    assert {"mlm", "causal", "prefix_lm", "span_corruption", "bart", "mass", "unilm", "bilm"} <= set(transforms.registered())
    names = ", ".join(sorted(transforms.registered()))  # every registered transform is offered
    with pytest.raises(UserError, match=rf"^data.objective='no_such_objective' is unknown; use one of {names}$"):
        PretrainingStream([docs()], TOK, cfg(objective="no_such_objective"), batch_size=8, seed=0)
    with pytest.raises(UserError, match=r"data.instances='rows' is unknown; use one of pairs, sentence_pairs, "
                                         r"full_sentences, doc_sentences, packed"):
        transforms.make(cfg(instances="rows"), TOK)
    with pytest.raises(UserError, match=r"'sentence_pairs' makes NSP pairs, not 'sop'"):
        transforms.make(cfg(instances="sentence_pairs", sentence_task="sop"), TOK)


def test_a_registered_transform_drives_the_stream(monkeypatch):
    monkeypatch.setattr(transforms, "TRANSFORMS", transforms.registered())

    @transforms.register("first_sentences")
    class FirstSentences(transforms.Transform):
        per_batch = True

        def instances(self, documents, rng):
            firsts = [d[0][:4] for d in documents if len(d[0]) >= 4]
            return {"input_ids": np.stack(firsts)}

        def corrupt(self, batch, rng):
            return {**batch, "noise": rng.integers(0, 1 << 30, len(batch["input_ids"]))}

    documents = docs(40)
    rows = {tuple(d[0][:4]) for d in documents if len(d[0]) >= 4}
    stream = PretrainingStream([documents], TOK, cfg(objective="first_sentences"), batch_size=len(rows), seed=0)
    x, y = next(stream), next(stream)
    assert {tuple(r) for r in x["input_ids"]} == rows == {tuple(r) for r in y["input_ids"]}  # a pass each
    assert not np.array_equal(x["noise"], y["noise"])  # corrupted afresh every batch


def _reference_mlm(documents, c, seed, batch_size, steps):
    """Batches of BERT's MLM + NSP stream built directly from create_pair_instances and
    mask_tokens, seeded as the pipeline seeds them: rng [seed, 1, pass] pairs, [seed, 2, pass]
    shuffles, [seed, 3, pass] masks a static pass (pass mod dupe_factor) or [seed, 3, step] a
    dynamic batch; eval pairs [seed, 4, 0] masked by [seed, 4, 1]."""
    static = c.masking == "static"
    options = dict(vocab_size=TOK.vocab_size, mask_id=TOK.mask_id, special_ids=[0, 2, 3, 4, 5],
                   max_predictions=c.max_predictions_per_seq, masked_lm_prob=c.masked_lm_prob, pad_id=TOK.pad_id)

    def pairs(rng):
        inst = create_pair_instances(documents, max_seq_length=c.max_seq_length, short_seq_prob=c.short_seq_prob,
                                     cls_id=TOK.cls_id, sep_id=TOK.sep_id, pad_id=TOK.pad_id, rng=rng)
        return {"input_ids": inst.input_ids, "segment_ids": inst.segment_ids, "input_mask": inst.input_mask,
                "next_sentence_label": inst.next_sentence_label}

    passes = []
    while sum(len(p["input_ids"]) for p in passes) < batch_size * steps:
        source = len(passes) % c.dupe_factor if static else len(passes)
        inst = pairs(np.random.default_rng([seed, 1, source]))
        order = np.random.default_rng([seed, 2, source]).permutation(len(inst["input_ids"]))
        inst = {k: v[order] for k, v in inst.items()}
        if static:
            inst.update(mask_tokens(inst["input_ids"], np.random.default_rng([seed, 3, source]), **options))
        passes.append(inst)
    rows = {k: np.concatenate([p[k] for p in passes]) for k in passes[0]}
    batches = []
    for step in range(steps):
        batch = {k: v[step * batch_size : (step + 1) * batch_size] for k, v in rows.items()}
        if not static:
            batch.update(mask_tokens(batch["input_ids"], np.random.default_rng([seed, 3, step]), **options))
        batches.append(batch)
    held_out = pairs(np.random.default_rng([seed, 4, 0]))
    held_out = {k: v[np.arange(2 * batch_size) % len(v)] for k, v in held_out.items()}
    held_out.update(mask_tokens(held_out["input_ids"], np.random.default_rng([seed, 4, 1]), **options))
    evals = [{k: v[i * batch_size : (i + 1) * batch_size] for k, v in held_out.items()} for i in range(2)]
    return batches, evals


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_mlm_transform_reproduces_the_original_stream(masking):
    documents, c = docs(25), cfg(masking=masking, dupe_factor=2, max_seq_length=32)
    batches, evals = _reference_mlm(documents, c, seed=7, batch_size=8, steps=30)
    stream = PretrainingStream([documents], TOK, c, batch_size=8, seed=7)
    got = take(stream, 30)
    assert stream.get_state()["corpora"][0]["pass"] >= 3  # static passes 2 and 3 repeat 0 and 1
    for step, (x, y) in enumerate(zip(got, batches)):
        assert x.keys() == y.keys(), step
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), (step, k)
    held_out = eval_batches([documents], TOK, c, batch_size=8, num_batches=2, seed=7)
    assert all(same(x, y) for x, y in zip(held_out, evals))


# --------------------------------------------------------------------- encoder-decoder denoising

SEQ2SEQ_KEYS = {"input_ids", "input_mask", "decoder_input_ids", "decoder_input_mask", "targets", "target_weights"}


@pytest.fixture(scope="module")
def embedded_documents():
    """The first 30 documents of the embedded corpus under a wordpiece vocab with T5's 100
    sentinels and under the byte-level BPE with an added <mask>."""
    import itertools

    from bertology.data.corpus import read_documents
    from bertology.data.embedded import BYTE_BPE_VOCAB, DEFAULT_VOCAB, embedded_corpus_path
    from bertology.data.tokenizers import load_tokenizer

    texts = list(itertools.islice(read_documents([embedded_corpus_path()]), 30))
    out = {}
    for name, tok in [("t5", load_tokenizer(DEFAULT_VOCAB, extra_ids=100)),
                      ("bart", load_tokenizer(BYTE_BPE_VOCAB, add_mask=True))]:
        out[name] = tok, [[np.array(tok.encode(s), np.int32) for s in d] for d in texts]
    return out


def check_contract(batch, rows, source, target, start=None):
    assert SEQ2SEQ_KEYS <= set(batch)
    for k in SEQ2SEQ_KEYS | ({"decoder_positions"} & set(batch)):
        assert batch[k].shape == (rows, source if k.startswith("input") else target), k
        assert batch[k].dtype == (np.float32 if k == "target_weights" else np.int32), k
    w = batch["target_weights"]
    np.testing.assert_array_equal(batch["decoder_input_mask"], w)
    if start is not None:  # decoder inputs are the targets shifted right behind the start id
        assert (batch["decoder_input_ids"][:, 0] == start).all()
        after = w[:, 1:] > 0
        np.testing.assert_array_equal(batch["decoder_input_ids"][:, 1:][after], batch["targets"][:, :-1][after])


def test_span_corruption_rows_rebuild_the_chunks(embedded_documents):
    tok, documents = embedded_documents["t5"]
    c = cfg(objective="span_corruption", max_seq_length=128)
    transform = transforms.make(c, tok)
    assert (transform.raw_length, transform.target_length) == (141, 29)  # T5's helper
    inst = transform.instances(documents, np.random.default_rng(0))
    # The chunks are the shuffled documents' tokens back to back, 141 per row.
    order = np.random.default_rng(0).permutation(len(documents))
    flat = np.concatenate([s for i in order for s in documents[i]])
    np.testing.assert_array_equal(inst["input_ids"][inst["input_mask"] == 1], flat[: inst["input_mask"].sum()])
    batch = transform.corrupt(inst, np.random.default_rng(1))
    rows = len(inst["input_ids"])
    check_contract(batch, rows, 128, 29, start=tok.pad_id)
    full = inst["input_mask"].sum(1) == 141
    assert full[:-1].all() and (batch["input_mask"][full].sum(1) == 128).all()  # exactly max_seq_length
    assert (batch["target_weights"][full].sum(1) == 29).all()
    top = tok.vocab_size - 100
    for r in range(rows):
        inputs = batch["input_ids"][r][batch["input_mask"][r] == 1]
        targets = batch["targets"][r][batch["target_weights"][r] == 1]
        assert inputs[-1] == targets[-1] == tok.eos_id
        spans = {p[0]: p[1:] for p in np.split(targets[:-1], np.flatnonzero(targets[:-1] >= top))[1:]}
        rebuilt = np.concatenate([spans[t] if t >= top else [t] for t in inputs[:-1]])
        np.testing.assert_array_equal(rebuilt, inst["input_ids"][r][inst["input_mask"][r] == 1])


@pytest.mark.parametrize("kind,target", [("iid", "sentinels"), ("bert", "full"), ("mass_style", "full"),
                                         ("drop", "noise"), ("deshuffle", "full"), ("prefix_lm", "kept")])
def test_t5_objective_table_rows(embedded_documents, kind, target):
    tok, documents = embedded_documents["t5"]
    transform = transforms.make(cfg(objective="span_corruption", max_seq_length=64, noise={"kind": kind}), tok)
    inst = transform.instances(documents, np.random.default_rng(0))
    batch = transform.corrupt(inst, np.random.default_rng(1))
    check_contract(batch, len(inst["input_ids"]), 64, 64, start=tok.pad_id)
    chunks = [r[m == 1] for r, m in zip(inst["input_ids"], inst["input_mask"])]
    inputs = [r[m == 1][:-1] for r, m in zip(batch["input_ids"], batch["input_mask"])]
    targets = [r[w == 1][:-1] for r, w in zip(batch["targets"], batch["target_weights"])]
    for chunk, x, y in zip(chunks, inputs, targets):
        if target == "full":
            np.testing.assert_array_equal(y, chunk)
        if kind == "drop":  # inputs and targets split the chunk in order
            assert len(x) + len(y) == len(chunk) and set(x) | set(y) == set(chunk)
        if kind == "prefix_lm":
            np.testing.assert_array_equal(np.concatenate([x, y]), chunk)
            assert len(x) >= 1 and len(y) >= 1
        if kind == "deshuffle":
            assert sorted(x) == sorted(chunk)
        if kind in ("bert", "mass_style"):
            assert len(x) == len(chunk)
    noise = np.mean([(x != c).mean() for x, c in zip(inputs, chunks) if len(x) == len(c)]) if kind in (
        "bert", "mass_style") else None
    if noise is not None:
        assert noise == pytest.approx(0.15, abs=0.03)  # the noise density


def test_bart_rows_reconstruct_the_block(embedded_documents):
    tok, documents = embedded_documents["bart"]
    transform = transforms.make(cfg(objective="bart", max_seq_length=64), tok)
    inst = transform.instances(documents, np.random.default_rng(0))
    batch = transform.corrupt(inst, np.random.default_rng(1))
    check_contract(batch, len(inst["input_ids"]), 64, 64, start=tok.eos_id)
    np.testing.assert_array_equal(batch["targets"], np.where(inst["input_mask"] == 1, inst["input_ids"], tok.pad_id))
    n = batch["input_mask"].sum(1)
    rows = np.arange(len(n))
    assert (batch["input_ids"][:, 0] == tok.cls_id).all() and (batch["input_ids"][rows, n - 1] == tok.eos_id).all()
    assert (batch["input_ids"] == tok.mask_id).any(axis=1).mean() > 0.9
    assert n.sum() < inst["input_mask"].sum()  # spans of several tokens collapse into one <mask>


def test_mass_rows(embedded_documents):
    tok, documents = embedded_documents["bart"]
    transform = transforms.make(cfg(objective="mass", max_seq_length=64), tok)
    inst = transform.instances(documents, np.random.default_rng(0))
    batch = transform.corrupt(inst, np.random.default_rng(1))
    check_contract(batch, len(inst["input_ids"]), 64, 32)
    for r in range(len(inst["input_ids"])):
        row = inst["input_ids"][r]
        m = int(batch["target_weights"][r].sum())
        pos = batch["decoder_positions"][r, :m]
        assert m == round(inst["input_mask"][r].sum() / 2) and (np.diff(pos) == 1).all()
        np.testing.assert_array_equal(batch["decoder_input_ids"][r, :m], row[pos])  # the real token before it
        np.testing.assert_array_equal(batch["targets"][r, :m], row[pos + 1])
        np.testing.assert_array_equal(batch["input_mask"][r], inst["input_mask"][r])


@pytest.mark.parametrize("objective,corpus,noise", [("span_corruption", "t5", {}),
                                                    ("span_corruption", "t5", {"kind": "prefix_lm"}),
                                                    ("bart", "bart", {}), ("mass", "bart", {})])
def test_denoising_streams_resume_exactly(embedded_documents, objective, corpus, noise):
    tok, documents = embedded_documents[corpus]
    documents = documents[:4]
    c = cfg(objective=objective, max_seq_length=32, noise=noise)
    a = take(PretrainingStream([documents], tok, c, batch_size=8, seed=1), 12)
    b = take(PretrainingStream([documents], tok, c, batch_size=8, seed=1), 12)
    assert all(same(x, y) for x, y in zip(a, b))
    s = PretrainingStream([documents], tok, c, batch_size=8, seed=0)
    while (position := s.get_state()["corpora"][0])["pass"] < 1 or position["offset"] == 0:  # mid-way through pass 1
        next(s)
    state = s.get_state()
    expected = take(s, 6)
    r = PretrainingStream([documents], tok, c, batch_size=8, seed=0)
    r.set_state(state)
    assert all(same(x, y) for x, y in zip(expected, take(r, 6)))
    p0, p1 = s.corpora[0].build(0), s.corpora[0].build(1)
    assert not same(p0, p1)  # noise drawn afresh every pass


def test_denoising_config_errors(embedded_documents):
    t5, _ = embedded_documents["t5"]
    from bertology.data.embedded import BYTE_BPE_VOCAB
    from bertology.data.tokenizers import load_tokenizer

    with pytest.raises(UserError, match=r"data.noise.kind='spam' is unknown; use one of spans, iid"):
        transforms.make(cfg(objective="span_corruption", noise={"kind": "spam"}), t5)
    with pytest.raises(UserError, match=r"data.noise.lambda does not apply to data.objective='bart'"):
        transforms.make(cfg(objective="bart", noise={"lambda": 3}), t5)
    with pytest.raises(UserError, match="extra_ids=100"):
        transforms.make(cfg(objective="span_corruption"), load_tokenizer(BYTE_BPE_VOCAB))
    with pytest.raises(UserError, match="add_mask=True"):
        transforms.make(cfg(objective="bart"), load_tokenizer(BYTE_BPE_VOCAB))
