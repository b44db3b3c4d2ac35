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
