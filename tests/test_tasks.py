"""Task builders read the official formats; QA windows map characters to tokens and back."""

import importlib
import pathlib

import numpy as np
import pytest

from bertology import tasks
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError
from bertology.tasks import embedded, encode, qa

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_VOCAB)


def load(name, sub):
    return tasks.get(name).load(str(FIXTURES / sub), None, log=lambda _: None)


def test_glue_formats():
    sst = load("sst2", "glue/SST-2")
    assert [len(sst[s]) for s in ("train", "validation", "test")] == [8, 3, 2]
    assert sst["train"][1] == {"idx": 1, "text_a": "unflinchingly bleak and desperate ", "text_b": "", "label": 0}
    assert sst["test"][0]["label"] == -1 and sst["test"][0]["idx"] == 0
    cola = load("cola", "glue/CoLA")  # train/dev without a header; test with one
    assert cola["train"][2]["text_a"] == "They drank the pub." and cola["train"][2]["label"] == 0
    assert cola["test"][0]["text_a"] == "Bill whistled past the house."
    mnli = load("mnli", "glue/MNLI")
    assert set(mnli) == {"train", "validation_matched", "validation_mismatched", "test_matched"}
    assert mnli["validation_matched"][1]["label"] == tasks.get("mnli").labels.index("contradiction")
    assert tasks.get("mnli").eval_splits == ("validation_matched", "validation_mismatched")
    sts = load("stsb", "glue/STS-B")
    assert sts["train"][1]["label"] == pytest.approx(3.8) and sts["train"][1]["text_b"] == "A man is playing a flute."
    mrpc = load("mrpc", "glue/MRPC")  # the quote characters are text, not CSV quoting
    assert mrpc["train"][0]["text_a"].startswith('Amrozi accused his brother , whom he called " the witness "')


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
    assert {n for m in ("glue", "squad", "conll", "swag", "embedded")
            for n in importlib.import_module(f"bertology.tasks.{m}").TASKS} == set(tasks.MODULES)


def test_squad_conll_swag_formats():
    squad = load("squad_v2", "squad")
    q6 = squad["validation"][-1]
    assert q6["id"] == "q6" and q6["is_impossible"] and q6["answers"] == []
    q1 = squad["train"][0]
    assert q1["answers"][0] == "a golden statue of the Virgin Mary"
    assert q1["context"][q1["answer_starts"][0]:].startswith(q1["answers"][0])
    conll = load("conll2003", "conll2003")
    labels = tasks.get("conll2003").labels
    first = conll["train"][0]
    assert first["tokens"][:3] == ["EU", "rejects", "German"]
    assert [labels[t] for t in first["tags"][:3]] == ["I-ORG", "O", "I-MISC"]
    assert len(conll["train"]) == 4 and "test" not in conll
    swag = load("swag", "swag")["train"]
    assert swag[0]["context"].startswith("Members of the procession")
    assert swag[0]["endings"][0] == "A drum line passes by walking down the street playing their instruments."
    assert swag[1]["endings"][3] == "Members of the procession continue to play marching, interspersed."
    assert [e["label"] for e in swag] == [0, 3, 1, 3]


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
