"""Tasks from the user's own files (`tasks.custom`): CSV/TSV/JSONL sentence and pair tasks with any
label set, CoNLL-style tagging with any tag set, their one-line errors, and a fine-tune that
learns a rule from a generated CSV and writes the test file's predictions by label name."""

import json

import numpy as np
import pytest
from helpers import save_to_disk, tiny

from bertology import tasks
from bertology.errors import UserError
from bertology.tasks import custom
from bertology.train.finetune import finetune


def data(tmp_path, files, **extra):
    """A data block naming `files` ({split: (name, text)}) written under tmp_path."""
    paths = {}
    for split, (name, text) in files.items():
        (tmp_path / name).write_text(text)
        paths[split] = str(tmp_path / name)
    return {"files": paths, "columns": extra.pop("columns", {}), **extra}


def load(name, block, tmp_path, **options):
    task = tasks.get(name, block)
    return task, task.load(None, str(tmp_path / "cache"), log=lambda _: None, **options)


CSV_TRAIN = 'claim,evidence,verdict\n"Water boils at 100C, at sea level",Physics texts,true\n' \
            '"He said ""no""",A quote,false\nThe moon is cheese,"Line one\nline two",unverified\n'
CSV_DEV = "claim,evidence,verdict\nSnow is cold,Weather,true\n"


def test_csv_pairs_with_quoted_fields_and_the_training_files_labels(tmp_path):
    block = data(tmp_path, {"train": ("train.csv", CSV_TRAIN), "validation": ("dev.csv", CSV_DEV),
                            "test": ("test.csv", "claim,evidence\nIce floats,Density\n")},
                 columns={"text": "claim", "pair": "evidence", "label": "verdict"})
    task, splits = load("text_classification", block, tmp_path)
    assert task.kind == "classification" and task.labels == ("false", "true", "unverified")  # sorted
    train = splits["train"]
    assert [e["text_a"] for e in train] == ["Water boils at 100C, at sea level", 'He said "no"', "The moon is cheese"]
    assert train[2]["text_b"] == "Line one\nline two"  # a quoted line break stays in its field
    assert [e["label"] for e in train] == [1, 0, 2] and [e["idx"] for e in train] == [0, 1, 2]
    assert splits["validation"][0]["label"] == 1
    assert splits["test"] == [{"idx": 0, "text_a": "Ice floats", "text_b": "Density", "label": -1}]  # no label column
    assert task.submissions == (("test", "test_predictions.tsv"),)


def test_tsv_reads_quotes_as_text_and_refuses_a_lossy_file(tmp_path):
    rows = "".join(f'"quoted {i}\t{i % 2}\n' for i in range(99))
    block = data(tmp_path, {"train": ("train.tsv", "text\tlabel\n" + rows + "broken row\n"),
                            "validation": ("dev.tsv", "text\tlabel\nfine\t1\n")})
    task, splits = load("text_classification", block, tmp_path)
    assert splits["train"][0]["text_a"] == '"quoted 0' and len(splits["train"]) == 99  # the broken row skipped
    assert splits.reads["train"].skipped == {"fields not the header's": 1}
    block = data(tmp_path, {"train": ("train2.tsv", "text\tlabel\na\t0\nb\t1\nlost\n\nc\t\n"),
                            "validation": ("dev.tsv", "text\tlabel\nfine\t1\n")})
    lossy = r"train2.tsv:4: 2 of 4 rows skipped \(1 fields not the header's, 1 no label\).*max_skipped_fraction=0.50"
    with pytest.raises(UserError, match=lossy):
        load("text_classification", block, tmp_path)
    _, splits = load("text_classification", block, tmp_path, max_skipped_fraction=0.5)
    assert [e["text_a"] for e in splits["train"]] == ["a", "b"]  # a blank line is no row


def test_jsonl_with_any_label_values_and_given_label_order(tmp_path):
    lines = [{"tweet": "so good", "stars": 5}, {"tweet": "meh", "stars": 3}, {"tweet": "awful", "stars": 1}]
    block = data(tmp_path, {"train": ("train.jsonl", "\n".join(map(json.dumps, lines)) + "\n"),
                            "validation": ("dev.jsonl", json.dumps({"tweet": "ok", "stars": 3}))},
                 columns={"text": "tweet", "label": "stars"}, labels="5,3,1")
    task, splits = load("text_classification", block, tmp_path)
    assert task.labels == ("5", "3", "1") and [e["label"] for e in splits["train"]] == [0, 1, 2]
    block["labels"] = None
    assert tasks.get("text_classification", block).labels == ("1", "3", "5")  # numbers sorted by value
    block = data(tmp_path, {"train": ("reg.jsonl", "\n".join(map(json.dumps, lines))),
                            "validation": ("dev.jsonl", json.dumps({"tweet": "ok", "stars": 3.5}))},
                 columns={"text": "tweet", "label": "stars"})
    task, splits = load("text_regression", block, tmp_path)
    assert task.kind == "regression" and task.labels == () and task.primary == "spearman"
    assert [e["label"] for e in splits["train"]] == [5.0, 3.0, 1.0] and splits["validation"][0]["label"] == 3.5


@pytest.mark.parametrize("name, files, extra, message", [
    ("text_classification", {"validation": ("dev.csv", CSV_DEV)}, {}, r"set --config.data.files.train=PATH"),
    ("text_classification", {"train": ("train.csv", CSV_TRAIN), "validation": ("dev.csv", CSV_DEV)}, {},
     r"train.csv:1: the header lacks column\(s\) \['text', 'label'\].*data.columns"),
    ("text_classification", {"train": ("t.csv", "text,label\na,x\nb,y\n"), "validation": ("d.csv", "text,label\nc,z\n")},
     {}, r"d.csv:2: label 'z' is not one of \['x', 'y'\].*data.labels"),
    ("text_classification", {"train": ("t.csv", "text,label\na,x\nb,x\n"), "validation": ("d.csv", "text,label\nc,x\n")},
     {}, r"the training file has 1 label\(s\)"),
    ("text_regression", {"train": ("t.csv", "text,label\na,0.5\nb,high\n"), "validation": ("d.csv", "text,label\nc,1\n")},
     {}, r"t.csv:3: label 'high' is not a number"),
    ("text_classification", {"train": ("t.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 0'),
                             "validation": ("d.jsonl", "")}, {}, r"t.jsonl:2: not a JSON object"),
    ("text_classification", {"train": ("t.jsonl", '{"text": "a", "label": 1}\n{"label": 0}\n'),
                             "validation": ("d.jsonl", "")}, {}, r"t.jsonl:2: no \['text'\] key"),
    ("text_classification", {"train": ("t.xlsx", "x"), "validation": ("d.csv", CSV_DEV)}, {}, r"unknown file type '.xlsx'"),
    ("token_tagging", {"train": ("t.txt", "The DT\ndog\n"), "validation": ("d.txt", "")}, {},
     r"t.txt:2: 'dog' is not 'word ... tag'"),
])
def test_bad_files_stop_with_one_line(tmp_path, name, files, extra, message):
    with pytest.raises(UserError, match=message) as e:
        load(name, data(tmp_path, files, **extra), tmp_path)
    assert "\n" not in str(e.value)


POS_TRAIN = "-DOCSTART- -X-\n\nThe DT\ndog NN\nbarks VBZ\n\nA DT\ncat NN\n"


def test_conll_tagging_with_any_tag_set(tmp_path):
    block = data(tmp_path, {"train": ("train.txt", POS_TRAIN), "validation": ("dev.txt", "Dogs NNS\nbark VBP\n")},
                 labels="DT,NN,VBZ,NNS,VBP")
    task, splits = load("token_tagging", block, tmp_path)
    assert task.kind == "token" and task.primary == "accuracy"  # not BIO: no entity F1
    assert splits["train"] == [{"idx": 0, "tokens": ["The", "dog", "barks"], "tags": [0, 1, 2]},
                               {"idx": 1, "tokens": ["A", "cat"], "tags": [0, 1]}]
    gold = splits["validation"]
    assert task.score(gold, [["NNS", "VBZ"]]) == {"accuracy": 50.0}
    ner = data(tmp_path, {"train": ("ner.txt", "Paris NNP B-LOC\nis VBZ O\nnice JJ O\n"),
                          "validation": ("nerdev.txt", "Rome NNP B-LOC\nsleeps VBZ O\n")})
    task = tasks.get("token_tagging", ner)
    assert task.labels == ("O", "B-LOC") and task.primary == "f1"  # O first; BIO tags score entities
    dev = task.load(None, str(tmp_path / "cache"), log=lambda _: None)["validation"]
    assert task.score(dev, [["O", "O"]]) == {"accuracy": 50.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert task.score(dev, [["B-LOC", "O"]])["f1"] == 100.0


def test_classification_scores_accuracy_and_macro_f1():
    task = custom._score_classes
    examples = [{"label": y} for y in (0, 0, 1, 2)]
    # class 0: P 1, R 1/2; class 1: P 1/2, R 1; class 2: P 1, R 1 -> F1 2/3, 2/3, 1
    scores = task(("a", "b", "c"), examples, np.array([0, 1, 1, 2]))
    assert scores["accuracy"] == 75.0 and scores["macro_f1"] == pytest.approx(100 * (2 / 3 + 2 / 3 + 1) / 3)


@pytest.mark.slow
def test_fine_tuning_learns_a_rule_from_a_csv_and_writes_test_predictions(tmp_path):
    """A tiny BERT from scratch on generated rows whose label is the sentence's polarity word:
    validation accuracy near 100%, and the test file's predictions written by label name."""
    rng = np.random.default_rng(0)
    filler = ["the", "film", "was", "really", "quite", "a", "story", "plot", "actor", "scene"]

    def rows(n):
        out = []
        for _ in range(n):
            label = rng.choice(["favor", "against"])
            words = list(rng.choice(filler, 6)) + ["great" if label == "favor" else "awful"]
            rng.shuffle(words)
            out.append((" ".join(words), label))
        return out

    def csv(rs, labelled=True):
        return "text,stance\n" + "".join(f"{t},{y}\n" if labelled else f"{t}\n" for t, y in rs)

    test_rows = rows(6)
    block = data(tmp_path, {"train": ("train.csv", csv(rows(160))), "validation": ("dev.csv", csv(rows(40))),
                            "test": ("test.csv", csv(test_rows, labelled=False).replace("text,stance", "text"))})
    c = tiny("text_classification", total_steps=60, batch_size=16)
    c.data.files.update(block["files"])
    c.data.columns.label = "stance"
    c.data.cache_dir = str(tmp_path / "cache")
    result = finetune(c, tmp_path / "run")
    assert result["scores"]["accuracy"] >= 90.0, result["scores"]
    lines = (tmp_path / "run" / "submission" / "test_predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert [line.split("\t")[1] for line in lines[1:]] == [y for _, y in test_rows]


def test_hugging_face_tables_parquet_arrow_and_save_to_disk(tmp_path):
    """The formats `datasets` keeps on disk read as the CSV they hold: a parquet training file, an
    Arrow file in the IPC stream format (`datasets`' own) and in the file format, and a
    `save_to_disk` directory of two shards; a DatasetDict directory and a broken file stop with
    one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = [{"sentence": f"row {i}", "label": "pos" if i % 2 else "neg", "extra": i} for i in range(7)]
    dev = [{"sentence": "fine", "label": "pos", "extra": 0}, {"sentence": "bad", "label": "neg", "extra": 1}]
    pq.write_table(pa.Table.from_pylist(train), tmp_path / "train.parquet")
    with pa.OSFile(str(tmp_path / "dev.arrow"), "wb") as sink, pa.ipc.new_file(sink, pa.Table.from_pylist(dev).schema) as w:
        w.write_table(pa.Table.from_pylist(dev))
    saved = save_to_disk(tmp_path / "saved" / "test", train[:5])
    block = {"files": {"train": str(tmp_path / "train.parquet"), "validation": str(tmp_path / "dev.arrow"),
                       "test": str(saved)}, "columns": {"text": "sentence"}}
    task, splits = load("text_classification", block, tmp_path)
    assert task.labels == ("neg", "pos")
    assert [(e["text_a"], e["label"]) for e in splits["train"]] == [(r["sentence"], int(r["label"] == "pos")) for r in train]
    assert [e["text_a"] for e in splits["validation"]] == ["fine", "bad"]
    assert [e["text_a"] for e in splits["test"]] == [f"row {i}" for i in range(5)]  # both shards, in order
    (tmp_path / "saved" / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    with pytest.raises(UserError, match=r"holds a DatasetDict \(test\); name one split's directory, e\.g\. .*saved/test"):
        load("text_classification", {**block, "files": {**block["files"], "test": str(tmp_path / "saved")}}, tmp_path)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match=r"broken.parquet: not a parquet file") as e:
        load("text_classification", {**block, "files": {**block["files"], "train": str(tmp_path / "broken.parquet")}},
             tmp_path)
    assert "\n" not in str(e.value)
