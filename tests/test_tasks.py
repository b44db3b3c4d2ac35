"""Task builders read the official formats; QA windows map characters to tokens and back."""

import importlib
import json

import ml_collections
import numpy as np
import pytest
from helpers import FIXTURES

from bertology import tasks
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.evaluation import conll as conll_metrics
from bertology.tasks import embedded, encode, qa
from bertology.tasks.kinds import featurize


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_VOCAB)


def load(name, sub, log=None):
    return tasks.get(name).load(str(FIXTURES / sub), None, log=log or (lambda _: None))


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def glue_dir(tmp_path, directory, train, dev):
    """A GLUE task directory with the given train.tsv and dev.tsv contents."""
    write(tmp_path / directory / "train.tsv", train)
    write(tmp_path / directory / "dev.tsv", dev)
    return str(tmp_path / directory)


def test_mrpc_header_with_byte_order_mark_reads_labels():
    """The GLUE download copies the MSR release's BOM into MRPC's train/dev headers."""
    assert (FIXTURES / "glue/MRPC/train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t#1 ID")
    mrpc = load("mrpc", "glue/MRPC")
    assert [e["label"] for e in mrpc["train"]] == [1, 0, 1, 0, 1]
    assert [e["label"] for e in mrpc["validation"]] == [1, 0, 0]
    assert [e["idx"] for e in mrpc["test"]] == [0, 1] and {e["label"] for e in mrpc["test"]} == {-1}
    # a quote is text, not CSV quoting, even at the start of a field
    assert mrpc["train"][0]["text_a"].startswith('Amrozi accused his brother , whom he called " the witness "')
    assert mrpc["validation"][0]["text_b"] == '" The foodservice pie business does not fit our long-term growth strategy .'
    assert mrpc.reads["train"].kept == 5 and not mrpc.reads["train"].skipped


def test_a_task_another_process_prepared_first_is_read_not_refused(tmp_path, monkeypatch):
    """Two test workers (or two runs) preparing the same task at once: TFDS's final rename finds
    the other's copy and raises FileExistsError; the loser reads that copy instead of failing."""
    from bertology.tasks import builder

    prepare = builder.LocalTask.download_and_prepare

    def lose_the_race(self, *args, **kwargs):
        prepare(self, *args, **kwargs)  # the other process's copy lands first ...
        raise FileExistsError("Cannot rename ...incomplete.X_1.1.0. Destination .../1.1.0 already exists.")

    monkeypatch.setattr(builder.LocalTask, "download_and_prepare", lose_the_race)
    sst = tasks.get("sst2").load(str(FIXTURES / "glue/SST-2"), str(tmp_path), log=lambda _: None)
    assert [len(sst[s]) for s in ("train", "validation", "test")] == [10, 3, 2]
    assert [p.name for p in tmp_path.rglob("reads.json*")] == ["reads.json"]


def test_glue_layouts():
    cola = load("cola", "glue/CoLA")  # train/dev without a header; test with one
    assert [e["label"] for e in cola["train"]] == [1, 1, 1, 1, 1, 0, 0, 1]
    assert cola["train"][5]["text_a"] == "They drank the pub."
    assert cola["test"][0] == {"idx": 0, "text_a": "Bill whistled past the house.", "text_b": "", "label": -1}
    sst = load("sst2", "glue/SST-2")
    assert [len(sst[s]) for s in ("train", "validation", "test")] == [10, 3, 2]
    assert sst["train"][4]["text_a"] == "on the worst revenge-of-the-nerds clich\u00e9s the filmmakers could dredge up "
    mnli = load("mnli", "glue/MNLI")  # train 12 columns, the two dev sets 16, test 10
    labels = tasks.get("mnli").labels
    assert set(mnli) == {"train", "validation_matched", "validation_mismatched", "test_matched"}
    assert tasks.get("mnli").eval_splits == ("validation_matched", "validation_mismatched")
    assert [labels[e["label"]] for e in mnli["validation_matched"]] == ["neutral", "contradiction", "entailment"]
    assert [labels[e["label"]] for e in mnli["validation_mismatched"]] == ["contradiction", "contradiction"]
    assert mnli["train"][5]["text_a"].startswith('"If you can\'t find it')  # unbalanced quotes stay text
    assert mnli["validation_mismatched"][1]["text_b"].endswith('"as some say.')
    sts = load("stsb", "glue/STS-B")
    assert [e["label"] for e in sts["train"]] == pytest.approx([5.0, 3.8, 3.8, 2.6, 0.0, 4.25])
    assert sts["train"][1]["text_b"] == "A man is playing a flute." and sts["test"][0]["label"] == -1.0
    for name, directory, train in (("qnli", "QNLI", ["not_entailment", "not_entailment", "entailment"]),
                                   ("rte", "RTE", ["not_entailment", "entailment", "entailment"]),
                                   ("wnli", "WNLI", ["1", "1", "1", "0"])):
        data = load(name, f"glue/{directory}")
        assert [tasks.get(name).labels[e["label"]] for e in data["train"]] == train


def test_qqp_broken_rows_are_counted_and_skipped():
    """QQP's train.tsv has questions broken across lines by a newline: rows with missing fields."""
    lines = []
    qqp = load("qqp", "glue/QQP", log=lines.append)
    assert [e["idx"] for e in qqp["train"]] == [133273, 402555, 360472, 150662, 183004]
    assert qqp.reads["train"].skipped == {"missing fields": 2} and qqp.reads["train"].kept == 5
    assert lines[-1] == "glue_qqp: train 5 read, 2 skipped (missing fields); validation 3 read; test 2 read"
    again = []  # the second load comes from the cache and reports the same
    assert load("qqp", "glue/QQP", log=again.append).reads == qqp.reads and again == [lines[-1]]


def test_glue_stray_and_trailing_tabs(tmp_path):
    d = glue_dir(tmp_path, "SST-2",
                 "sentence\tlabel\na fine film \t1\t\na dull\tfilm \t0\nthe worst \t0\n",
                 "sentence\tlabel\ngood \t1\n")
    sst = tasks.get("sst2").load(d, None, log=lambda _: None, max_skipped_fraction=0.5)
    assert [(e["text_a"], e["label"]) for e in sst["train"]] == [("a fine film ", 1), ("the worst ", 0)]
    assert sst.reads["train"].skipped == {"extra fields": 1} and sst.reads["train"].first_skipped == 3
    assert sst.reads["train"].converted == {"trailing tab": 1}


def test_glue_file_losing_more_than_one_percent_of_its_rows_is_refused(tmp_path):
    """SST-2's release has no broken rows: a train.tsv where every third row lost its label column
    is refused by default, naming the first bad line and the setting that allows it; QQP, whose
    release has broken rows, is read whatever it skips."""
    rows = "".join(f"sentence {i} \t{i % 2}\n" if i % 3 else f"sentence {i} \n" for i in range(1, 301))
    d = glue_dir(tmp_path, "SST-2", "sentence\tlabel\n" + rows, "sentence\tlabel\ngood \t1\n")
    sst2 = tasks.get("sst2")
    with pytest.raises(UserError, match=r"SST-2/train\.tsv:4: 100 of 300 rows skipped \(100 missing fields\), more than "
                                        r"1%; .* --config\.data\.max_skipped_fraction=0\.33 to train on the rest$"):
        sst2.load(d, None, log=lambda _: None)
    assert len(sst2.load(d, None, log=lambda _: None, max_skipped_fraction=0.34)["train"]) == 200
    # 1 of 101 rows (0.99%) is within the default
    one = "".join(f"sentence {i} \t1\n" for i in range(100)) + "broken \n"
    assert len(sst2.load(glue_dir(tmp_path / "one", "SST-2", "sentence\tlabel\n" + one, "sentence\tlabel\ngood \t1\n"),
                         None, log=lambda _: None)["train"]) == 100


@pytest.mark.parametrize("train, dev, message", [
    # every label missing: the run would train on nothing
    ("sentence\tlabel\ngood \t1\n", "sentence\tlabel\ngood \t\nbad \t\n",
     r"SST-2/dev\.tsv gave no labelled example \(2 no label\)"),
    # a label outside the task's label set names the file and line
    ("sentence\tlabel\ngood \t1\nbad \t2\n", "sentence\tlabel\ngood \t1\n",
     r"SST-2/train\.tsv:3: label '2' is not one of \['0', '1'\]"),
    # not SST-2's header (CoLA's headerless rows)
    ("gj04\t1\t\tFine.\n", "sentence\tlabel\ngood \t1\n", r"train\.tsv:1: the header lacks column\(s\) \['sentence', 'label'\]"),
    # the right header but no row with its field count
    ("sentence\tlabel\ngood\n bad\n", "sentence\tlabel\ngood \t1\n", r"no row has the header's 2 tab-separated fields"),
])
def test_glue_files_that_are_not_the_task_fail_in_one_line(tmp_path, train, dev, message):
    with pytest.raises(UserError, match=message):
        tasks.get("sst2").load(glue_dir(tmp_path, "SST-2", train, dev), None, log=lambda _: None)


def test_glue_wrong_task_and_bad_scores(tmp_path):
    with pytest.raises(UserError, match=r"header lacks column\(s\) \['#1 String', '#2 String', 'Quality'\]"):
        tasks.get("mrpc").load(str(FIXTURES / "glue/SST-2"), None, log=lambda _: None)
    with pytest.raises(UserError, match=r"CoLA/train\.tsv: no row has the header's 4"):  # an SST-2 file given as CoLA
        tasks.get("cola").load(glue_dir(tmp_path, "CoLA", "good \t1\nbad \t0\n", "gj04\t1\t\tFine.\n"), None)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tA jet.\t{}\n"
    with pytest.raises(UserError, match=r"STS-B/dev\.tsv:3: score '5.5' is not a number in"):
        tasks.get("stsb").load(glue_dir(tmp_path, "STS-B", header + row.format("4.0"),
                                        header + row.format("1.0") + row.format("5.5")), None)


def test_missing_files_say_where(tmp_path):
    with pytest.raises(UserError, match=r"missing .*SST-2/dev\.tsv; put the GLUE SST-2 files there"):
        (tmp_path / "SST-2").mkdir()
        (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\n")
        tasks.get("sst2").load(str(tmp_path / "SST-2"), None)
    with pytest.raises(UserError, match=r"missing .*train-v2\.0\.json"):
        tasks.get("squad_v2").load(str(tmp_path), None)
    with pytest.raises(UserError, match=r"missing .*train\.txt; put the CoNLL-2003"):
        tasks.get("conll2003").load(str(tmp_path), None)
    with pytest.raises(UserError, match="unknown task 'sst3'"):
        tasks.get("sst3")
    assert {n for m in set(tasks.MODULES.values())  # each module's tasks are exactly the names routed to it
            for n in importlib.import_module(f"bertology.tasks.{m}").TASKS} == set(tasks.MODULES)


def test_squad_versions():
    v1 = load("squad_v1", "squad")
    assert [len(e["answers"]) for e in v1["train"]] == [1] * 5
    assert [len(e["answers"]) for e in v1["validation"]] == [3] * 5  # the dev set's several crowd answers
    q1 = v1["validation"][0]
    assert q1["answers"][:2] == ["a golden statue of the Virgin Mary", "golden statue of the Virgin Mary"]
    assert all(q1["context"][s:].startswith(a) for a, s in zip(q1["answers"], q1["answer_starts"]))
    v2 = load("squad_v2", "squad")
    q6 = v2["validation"][-1]  # unanswerable: its plausible answer is not an answer
    assert q6["id"] == "q6" and q6["is_impossible"] and q6["answers"] == [] and q6["answer_starts"] == []
    assert [e["is_impossible"] for e in v2["train"]] == [False] * 5 + [True]


def test_squad_files_of_the_wrong_kind(tmp_path):
    with pytest.raises(UserError, match=r"dev-v1\.1\.json is SQuAD v2\.0, not v1\.1; use task squad_v2"):
        write(tmp_path / "train-v1.1.json", (FIXTURES / "squad/train-v1.1.json").read_text())
        write(tmp_path / "dev-v1.1.json", (FIXTURES / "squad/dev-v2.0.json").read_text())
        tasks.get("squad_v1").load(str(tmp_path), None)
    doc = json.loads((FIXTURES / "squad/train-v1.1.json").read_text())
    qas = doc["data"][0]["paragraphs"][0]["qas"]
    qas[0]["answers"][0]["answer_start"] += 1  # misaligned: skipped and counted, as the reference does
    write(tmp_path / "train-v1.1.json", json.dumps(doc))
    write(tmp_path / "dev-v1.1.json", (FIXTURES / "squad/dev-v1.1.json").read_text())
    data = tasks.get("squad_v1").load(str(tmp_path), None, log=lambda _: None)
    assert [e["id"] for e in data["train"]] == ["q2", "q3", "q4", "q5"]
    assert data.reads["train"].skipped == {"answer text not at its answer_start": 1}
    for article in doc["data"]:  # a dev file without answers cannot be scored
        for question in article["paragraphs"][0]["qas"]:
            question["answers"] = []
    write(tmp_path / "dev-v1.1.json", json.dumps(doc))
    with pytest.raises(UserError, match=r"dev-v1\.1\.json gave no labelled example \(5 answerable question without"):
        tasks.get("squad_v1").load(str(tmp_path), None)


def test_conll_iob1_original_and_iob2_rerelease_read_the_same():
    labels = tasks.get("conll2003").labels
    assert (FIXTURES / "conll2003/eng.train").read_text().startswith("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\n")
    assert (FIXTURES / "conll2003_iob2/train.txt").read_text().startswith("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n")
    iob1, iob2 = load("conll2003", "conll2003"), load("conll2003", "conll2003_iob2")
    assert iob1 == iob2 and len(iob1["train"]) == 5 and "test" not in iob1
    first = iob1["train"][0]
    assert first["tokens"][:3] == ["EU", "rejects", "German"]
    assert [labels[t] for t in first["tags"][:3]] == ["B-ORG", "O", "B-MISC"]
    dutch = iob1["train"][4]  # adjacent MISC entities: B- in IOB1 only on the second
    assert [labels[t] for t in dutch["tags"][1:4]] == ["B-MISC", "B-MISC", "I-MISC"]
    assert iob2.reads["train"].converted == {} and iob1.reads["train"].converted == {
        "IOB1 entity starts retagged B- (IOB2)": 13}


def test_conll_scores_either_scheme_alike():
    gold1 = [line.split()[-1] for line in (FIXTURES / "conll2003/eng.testa").read_text().splitlines()
             if line and not line.startswith("-DOCSTART-")]
    gold2 = [line.split()[-1] for line in (FIXTURES / "conll2003_iob2/valid.txt").read_text().splitlines()
             if line and not line.startswith("-DOCSTART-")]
    assert gold1 != gold2 and conll_metrics.to_iob2(gold1) == gold2 == conll_metrics.to_iob2(gold2)
    pred = ["O"] * len(gold2)
    pred[2], pred[13:15], pred[16] = "B-ORG", ["B-MISC", "I-MISC"], "B-PER"  # Phil without Simmons is wrong
    s1, s2 = conll_metrics.entity_scores([gold1], [pred]), conll_metrics.entity_scores([gold2], [pred])
    assert s1 == s2 and s1["gold_entities"] == 6
    assert (s1["precision"], s1["recall"]) == pytest.approx((100 * 2 / 3, 100 * 2 / 6))


def test_conll_bad_lines_name_file_and_line(tmp_path):
    write(tmp_path / "train.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP S-PER\n")
    write(tmp_path / "valid.txt", "EU NNP B-NP B-ORG\n")
    with pytest.raises(UserError, match=r"train\.txt:4: unknown NER tag 'S-PER'"):
        tasks.get("conll2003").load(str(tmp_path), None)


def test_swag_csv():
    swag = load("swag", "swag")
    train, val = swag["train"], swag["validation"]
    assert train[0]["context"].startswith("Members of the procession")
    assert train[0]["endings"][0] == "A drum line passes by walking down the street playing their instruments."
    assert train[1]["endings"][3] == "Members of the procession continue to play marching, interspersed."
    assert [e["label"] for e in train] == [0, 3, 1, 3] and [e["label"] for e in val] == [2, 2, 0]
    assert val[0]["endings"][0] == "She pats her shoulder, then saunters toward someone."  # a quoted comma


def test_swag_bad_files(tmp_path):
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
    row = "0,v,1,A b. C,A b.,C,gold,d,e,f,g,{}\n"
    write(tmp_path / "train.csv", header + row.format(1) + row.format(4))
    write(tmp_path / "val.csv", header + row.format(0))
    with pytest.raises(UserError, match=r"train\.csv:3: label '4' is not one of 0-3"):
        tasks.get("swag").load(str(tmp_path), None)
    write(tmp_path / "train.csv", header + row.format(1) + "0,v,1,short row\n" + row.format(""))
    data = tasks.get("swag").load(str(tmp_path), None, log=lambda _: None)
    assert [e["label"] for e in data["train"]] == [1]
    assert data.reads["train"].skipped == {"wrong field count": 1, "no label": 1}
    write(tmp_path / "val.csv", "sentence\tlabel\ngood\t1\n")
    with pytest.raises(UserError, match=r"val\.csv:1: the header lacks column\(s\) \['sent1'"):
        tasks.get("swag").load(str(tmp_path), None)


def test_embedded_task_has_balanced_real_labels():
    task = tasks.get("embedded")
    classes, sentences = embedded.labelled_sentences()
    assert task.labels == classes and len(classes) == embedded.NUM_CLASSES
    assert "asyncio" in classes and "email" in classes
    data = task.load(None, None, log=lambda _: None)
    n = {s: len(v) for s, v in data.items()}
    assert n["validation"] == n["test"] == sum(len(s) // 10 for s in sentences.values())
    train, val = {e["text_a"] for e in data["train"]}, {e["text_a"] for e in data["validation"]}
    assert not train & val
    counts = np.bincount([e["label"] for e in data["train"]], minlength=len(classes))
    assert counts.max() - counts.min() <= 0.2 * counts.max()  # roughly balanced
    asyncio_sentences = set(sentences["asyncio"])
    assert all(e["text_a"] in asyncio_sentences for e in data["validation"] if e["label"] == classes.index("asyncio"))


def test_pair_truncation_and_packing(tokenizer):
    a, b = encode.truncate_pair([1, 2, 3, 4, 5], [6, 7], 5)
    assert (a, b) == ([1, 2, 3], [6, 7])  # the longer side loses its last tokens
    a, b = encode.truncate_pair([1, 2, 3], [4, 5, 6], 4)
    assert (a, b) == ([1, 2], [4, 5])  # ties cut the second side first
    a, b = tokenizer.encode("the module"), tokenizer.encode("a function")
    assert (len(a), len(b)) == (2, 2)
    row = encode.encode_pair(tokenizer, "the module", "a function", 8)
    assert row["input_ids"].tolist() == [tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id, tokenizer.pad_id]
    assert row["segment_ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
    assert row["input_mask"].tolist() == [1] * 7 + [0]


def test_first_subword_labels(tokenizer):
    words = ["Blackburnshire", "runs"]
    pieces = [tokenizer.encode(w) for w in words]
    assert len(pieces[0]) > 1
    row = encode.encode_words(tokenizer, words, [2, 0], 16)
    n0 = len(pieces[0])
    assert row["labels"][: n0 + 3].tolist() == [-1, 2] + [-1] * (n0 - 1) + [0, -1]
    assert row["word_index"][1] == 0 and row["word_index"][1 + n0] == 1


def test_offsets_round_trip(tokenizer):
    text = 'Atop the Main Building\'s dome, "Venite Ad Me Omnes" -- 24\u201310 in 1990s.'
    ids, spans = qa.tokenize_with_offsets(tokenizer, text)
    assert ids == tokenizer.encode(text)  # the same tokens as tokenizing the whole text
    for answer in ("Main Building", "Venite Ad Me Omnes", "24\u201310", "1990s", "dome"):
        start = text.index(answer)
        first, last = qa.char_to_token_span(spans, start, start + len(answer))
        assert text[spans[first][0]:spans[last][1]] == answer


def test_qa_windows_round_trip_across_boundaries(tokenizer):
    squad = load("squad_v2", "squad")["train"]
    max_len, stride = 40, 8
    arrays, windows, spans = qa.encode(tokenizer, squad, max_len, stride, 16)
    for e, ex in enumerate(squad):
        mine = [w for w, win in enumerate(windows) if win.example == e]
        labelled = [w for w in mine if arrays["start_position"][w] > 0]
        if ex["is_impossible"]:
            assert not labelled
            continue
        assert len(mine) >= 2  # every context here spans several windows
        for w in labelled:  # start/end positions map back to exactly the gold answer text
            s, t = arrays["start_position"][w], arrays["end_position"][w]
            first, last = windows[w].token_to_doc[s], windows[w].token_to_doc[t]
            assert ex["context"][spans[e][first][0]:spans[e][last][1]] == ex["answers"][0]
        # a window that holds the answer only in part points at [CLS]
        start = ex["answer_starts"][0]
        first, last = qa.char_to_token_span(spans[e], start, start + len(ex["answers"][0]))
        for w in mine:
            doc = windows[w].token_to_doc[windows[w].token_to_doc >= 0]
            whole = doc[0] <= first and last <= doc[-1]
            assert (arrays["start_position"][w] > 0) == whole
    # each context token is "max context" in exactly one window
    for e in range(len(squad)):
        hits = np.zeros(len(spans[e]), int)
        for win in (w for w in windows if w.example == e):
            hits[win.token_to_doc[win.max_context]] += 1
        assert (hits == 1).all()


def test_qa_decode_picks_span_and_null(tokenizer):
    ex = [{"id": "a", "context": "The Denver Broncos won.", "question": "Who won?", "answers": ["Denver Broncos"],
           "answer_starts": [4], "is_impossible": False}]
    arrays, windows, spans = qa.encode(tokenizer, ex, 32, 8, 8)
    s, t = int(arrays["start_position"][0]), int(arrays["end_position"][0])
    start, end = np.full((1, 32), -5.0), np.full((1, 32), -5.0)
    start[0, s], end[0, t] = 3.0, 3.0
    assert qa.decode(ex, windows, spans, start, end) == {"a": "Denver Broncos"}
    start[0, 0], end[0, 0] = 4.0, 4.0  # null score 8 beats the span's 6 by 2
    assert qa.decode(ex, windows, spans, start, end, null_threshold=1.0) == {"a": ""}
    assert qa.decode(ex, windows, spans, start, end, null_threshold=3.0) == {"a": "Denver Broncos"}
    # one token at most: the best is the gold start token alone (3 + -5 beats -5 + -5)
    first = spans[0][windows[0].token_to_doc[s]]
    assert qa.decode(ex, windows, spans, start, end, max_answer_length=1) == {"a": ex[0]["context"][first[0]:first[1]]}


XLNET = encode.Layout(cls_position="last", padding_side="left")


def test_xlnet_layout_classification(tokenizer):
    # xlnet classifier_utils.convert_single_example: a <sep> b <sep> <cls>, padded on the left,
    # segment ids a 0 (its <sep> too), b 1 (its <sep> too), <cls> 2, padding 4
    a, b = tokenizer.encode("the module"), tokenizer.encode("a function")
    sep, cls, pad = tokenizer.sep_id, tokenizer.cls_id, tokenizer.pad_id
    row = encode.encode_pair(tokenizer, "the module", "a function", 10, XLNET)
    assert row["input_ids"].tolist() == [pad, pad, pad, *a, sep, *b, sep, cls]
    assert row["segment_ids"].tolist() == [4, 4, 4, 0, 0, 0, 1, 1, 1, 2]
    assert row["input_mask"].tolist() == [0, 0, 0] + [1] * 7
    alone = encode.encode_pair(tokenizer, "the module", "", 5, XLNET)
    assert alone["input_ids"].tolist() == [pad, *a, sep, cls] and alone["segment_ids"].tolist() == [4, 0, 0, 0, 2]
    # the layout comes from the data keys, for every task kind that packs pairs
    data = ml_collections.ConfigDict(dict(max_seq_length=10, cls_position="last", padding_side="left"))
    example = {"text_a": "the module", "text_b": "a function", "label": 1}
    feats = featurize(tasks.get("sst2"), [example], tokenizer, data)
    assert feats.arrays["input_ids"][0].tolist() == row["input_ids"].tolist() and feats.arrays["label"].tolist() == [1]


def test_xlnet_layout_word_labels(tokenizer):
    words = ["Blackburnshire", "runs"]
    n0 = len(tokenizer.encode(words[0]))
    row = encode.encode_words(tokenizer, words, [2, 0], 16, XLNET)
    used = n0 + 1 + 2  # the word pieces, <sep>, <cls>
    start = 16 - used
    assert row["labels"].tolist() == [-1] * start + [2] + [-1] * (n0 - 1) + [0, -1, -1]
    assert row["word_index"][start] == 0 and row["word_index"][start + n0] == 1
    assert row["input_ids"][-1] == tokenizer.cls_id and row["input_mask"][:start].sum() == 0


def test_xlnet_layout_squad_spans_shift(tokenizer):
    # xlnet run_squad: context <sep> question <sep> <cls>; here padded on the left as the classifier
    # and Hugging Face's XLNet tokenizer pad, so every answer position moves by the padding
    squad = load("squad_v2", "squad")["train"]
    max_len, stride = 40, 8
    bert, bert_windows, _ = qa.encode(tokenizer, squad, max_len, stride, 16)
    xl, windows, spans = qa.encode(tokenizer, squad, max_len, stride, 16, XLNET)
    assert len(windows) == len(bert_windows)
    answered = 0
    for w, win in enumerate(windows):
        ex = squad[win.example]
        query = tokenizer.encode(ex["question"])[:16]
        length = int((win.token_to_doc >= 0).sum())
        pad = max_len - (length + len(query) + 3)
        assert win.cls_index == max_len - 1 and xl["input_ids"][w, -1] == tokenizer.cls_id
        assert (win.token_to_doc[pad:pad + length] == np.arange(win.doc_start, win.doc_start + length)).all()
        assert xl["input_ids"][w, pad + length + 1:pad + length + 1 + len(query)].tolist() == query
        s, t = int(xl["start_position"][w]), int(xl["end_position"][w])
        if bert["start_position"][w] == 0:
            assert s == t == max_len - 1  # no answer here: the summary token
            continue
        answered += 1
        shift = pad - (len(query) + 2)  # BERT's context starts after [CLS] question [SEP]
        assert (s, t) == (bert["start_position"][w] + shift, bert["end_position"][w] + shift)
        np.testing.assert_array_equal(xl["input_ids"][w, s:t + 1],
                                      bert["input_ids"][w, s - shift:t - shift + 1])
        first, last = win.token_to_doc[s], win.token_to_doc[t]
        assert ex["context"][spans[win.example][first][0]:spans[win.example][last][1]] == ex["answers"][0]
    assert answered > 0
    # the null score is read at the summary token
    ex = [{"id": "a", "context": "The Denver Broncos won.", "question": "Who won?", "answers": ["Denver Broncos"],
           "answer_starts": [4], "is_impossible": False}]
    arrays, wins, sp = qa.encode(tokenizer, ex, 32, 8, 8, XLNET)
    s, t = int(arrays["start_position"][0]), int(arrays["end_position"][0])
    start, end = np.full((1, 32), -5.0), np.full((1, 32), -5.0)
    start[0, s], end[0, t] = 3.0, 3.0
    assert qa.decode(ex, wins, sp, start, end) == {"a": "Denver Broncos"}
    start[0, 31], end[0, 31] = 4.0, 4.0
    assert qa.decode(ex, wins, sp, start, end, null_threshold=1.0) == {"a": ""}
    start[0, 31], end[0, 31] = -5.0, -5.0
    start[0, 0], end[0, 0] = 4.0, 4.0  # position 0 is padding now, not the summary token
    assert qa.decode(ex, wins, sp, start, end, null_threshold=1.0) == {"a": "Denver Broncos"}


def test_gpt_similarity_reads_each_pair_in_both_orders(tokenizer):
    """GPT-1's similarity input (Radford et al. 2018 §3.3, `data.both_orders`): each pair becomes
    two rows, as given and swapped, and the task model's head reads the sum of their final states
    (a causal trunk's last real token): the logits are the head on pooled(a;b) + pooled(b;a), so
    swapping the sentences changes nothing, while either order alone does."""
    import flax.linen as nn
    import jax

    from bertology.families.gpt.model import task_trunk
    from bertology.models.tasks import TaskModel
    from bertology.models.transformer import TransformerConfig

    data = ml_collections.ConfigDict(dict(max_seq_length=16, both_orders=True))
    example = {"text_a": "the module", "text_b": "a function returns", "label": 1.5}
    feats = featurize(tasks.get("stsb"), [example], tokenizer, data).arrays
    assert feats["input_ids"].shape == (1, 2, 16) and feats["label"].tolist() == [1.5]
    forward, backward = (encode.encode_pair(tokenizer, a, b, 16) for a, b in (("the module", "a function returns"),
                                                                             ("a function returns", "the module")))
    assert feats["input_ids"][0].tolist() == [forward["input_ids"].tolist(), backward["input_ids"].tolist()]
    swapped = featurize(tasks.get("stsb"), [{**example, "text_a": example["text_b"], "text_b": example["text_a"]}],
                        tokenizer, data).arrays
    cfg = TransformerConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=2, num_heads=2,
                            intermediate_size=32, max_position_embeddings=16, norm="pre", type_vocab_size=0)
    model = TaskModel(cfg, "regression", 1, "full", "gpt")
    params = nn.meta.unbox(model.init(jax.random.key(0), feats))["params"]
    got = np.asarray(model.apply({"params": params}, feats)["logits"])
    pooled = [task_trunk(cfg, "encoder").apply({"params": params["encoder"]}, {k: feats[k][:, i] for k in feats
                                                                                if k != "label"})["pooled"]
              for i in range(2)]
    head = params["head"]
    np.testing.assert_allclose(got, ((pooled[0] + pooled[1]) @ head["kernel"] + head["bias"])[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(model.apply({"params": params}, swapped)["logits"]), got)
    alone = np.asarray(model.apply({"params": params}, {k: v[:, 0] for k, v in feats.items() if k != "label"})["logits"])
    assert np.abs(alone - got).max() > 1e-3
    with pytest.raises(UserError, match="both_orders reads sentence pairs"):  # nothing to swap in a single sentence
        featurize(tasks.get("sst2"), [{"text_a": "x", "text_b": "", "label": 0}], tokenizer, data)
