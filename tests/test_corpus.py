"""The TFDS corpus builder: tokenized once into array_record, read back without TensorFlow."""

import sys

import pytest

from bertology.data import corpus as corpus_lib
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError


def write_corpus(path, n_docs, offset=0):
    lines = []
    for d in range(offset, offset + n_docs):
        lines += [f"Document {d} opens with a sentence.", f"Then sentence two of document {d} follows!", ""]
    path.write_text("\n".join(lines))


def test_round_trip_keeps_documents_sentences_and_order(tmp_path):
    (tmp_path / "c").mkdir()
    write_corpus(tmp_path / "c" / "a.txt", 60)
    write_corpus(tmp_path / "c" / "b.txt", 45, offset=60)
    tok = load_tokenizer(DEFAULT_VOCAB)
    docs = corpus_lib.load_documents(tmp_path / "c", tok, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None)
    assert len(docs["train"]) + len(docs["validation"]) == 105
    held_out = [49, 99]  # every 50th document
    assert len(docs["validation"]) == len(held_out)
    assert "tensorflow" not in sys.modules
    train_ids = [d for d in range(105) if d not in held_out]
    for doc, d in zip(docs["train"], train_ids):
        expected = [tok.encode(f"Document {d} opens with a sentence."), tok.encode(f"Then sentence two of document {d} follows!")]
        assert [s.tolist() for s in doc] == expected
    assert docs["validation"][0][0].tolist() == tok.encode("Document 49 opens with a sentence.")


def test_cache_is_reused_and_invalidated_by_edits(tmp_path):
    f = tmp_path / "c.txt"
    write_corpus(f, 5)
    tok = load_tokenizer(DEFAULT_VOCAB)
    logs = []
    corpus_lib.load_documents(f, tok, DEFAULT_VOCAB, tmp_path / "cache", log=logs.append)
    corpus_lib.load_documents(f, tok, DEFAULT_VOCAB, tmp_path / "cache", log=logs.append)
    assert len(logs) == 1  # built once
    write_corpus(f, 6)
    docs = corpus_lib.load_documents(f, tok, DEFAULT_VOCAB, tmp_path / "cache", log=logs.append)
    assert len(logs) == 2 and len(docs["train"]) + len(docs["validation"]) == 6


@pytest.mark.parametrize("content, message", [(None, "corpus not found"), ("", "is empty"),
                                               ("One doc.\n\nTwo docs.\n", "has 2 document(s)")])
def test_bad_corpora_are_user_errors(tmp_path, content, message):
    f = tmp_path / "c.txt"
    if content is not None:
        f.write_text(content)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        corpus_lib.load_documents(f, load_tokenizer(DEFAULT_VOCAB), DEFAULT_VOCAB, tmp_path / "cache")


def _texts(n):
    return [f"Document {d} opens with a sentence. Then sentence two of document {d} follows!" for d in range(n)]


def test_hugging_face_tables_read_as_the_same_json_lines(tmp_path):
    """A parquet corpus, chunked into several tasks of rows, and a `save_to_disk` directory of two
    Arrow shards (the layout `datasets` writes) give the documents the same texts give as JSON
    lines, their text in the column `text_column` names; a missing column or a row whose text is
    not a string stops with one line naming the file, the row or the column."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers import save_to_disk

    from bertology.data import prepare

    texts = _texts(60)
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    pq.write_table(pa.Table.from_pylist([{"id": i, "body": t} for i, t in enumerate(texts)]), tmp_path / "c.parquet",
                   row_group_size=16)
    saved = save_to_disk(tmp_path / "saved", [{"body": t} for t in texts])
    tok = load_tokenizer(DEFAULT_VOCAB)
    load = lambda c, **kw: corpus_lib.load_documents(c, tok, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None,  # noqa: E731
                                                     **kw)
    want = load(tmp_path / "c.jsonl")
    assert len(prepare.plan(tmp_path / "c.parquet", [tmp_path / "c.parquet"], chunk_bytes=1000, text_column="body")) > 1
    for corpus in (tmp_path / "c.parquet", saved):
        got = load(corpus, text_column="body")
        for split in ("train", "validation"):
            assert [[s.tolist() for s in d] for d in got[split]] == [[s.tolist() for s in d] for d in want[split]]
    with pytest.raises(UserError, match=r"c.parquet has no column 'text' \(it has \['id', 'body'\]\); set data.text_column"):
        load(tmp_path / "c.parquet")
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in texts[:4]] + [{"text": None}]), tmp_path / "holes.parquet")
    with pytest.raises(UserError, match=r"holes.parquet: row 5's 'text' is NoneType, not text"):
        load(tmp_path / "holes.parquet")
