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


def _cached_by_load_dataset(cache, home, config, texts, shards):
    """The train split as `datasets.load_dataset` caches it: CACHE/HOME/CONFIG/0.0.0/HASH/ with
    dataset_info.json and NAME-train-0000i-of-0000n.arrow (Arrow IPC streams), beside a `map`
    result (cache-*.arrow) that is no part of the split."""
    import json

    import pyarrow as pa

    build = cache / home / config / "0.0.0" / "a1b2"
    build.mkdir(parents=True)
    size = -(-len(texts) // shards)
    for i in range(shards):
        name = f"{home.split('___')[-1]}-train" + (f"-{i:05d}-of-{shards:05d}" if shards > 1 else "") + ".arrow"
        table = pa.Table.from_pylist([{"text": t} for t in texts[i * size : (i + 1) * size]])
        with pa.OSFile(str(build / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (build / "cache-0f.arrow").write_bytes(b"not the split")
    lengths = [len(texts[i * size : (i + 1) * size]) for i in range(shards)]
    split = {"name": "train", "num_examples": len(texts), **({"shard_lengths": lengths} if shards > 1 else {})}
    (build / "dataset_info.json").write_text(json.dumps({"dataset_name": home.split("___")[-1], "config_name": config,
                                                         "splits": {"train": split}}))


def test_hf_names_read_the_local_datasets_cache_and_nothing_else(tmp_path, monkeypatch):
    """`hf:NAME` is the train split `datasets.load_dataset` left in HF_DATASETS_CACHE (the same
    documents as those texts as JSON lines; a namespace and a snake-cased name found); several
    cached configs need `hf:NAME:CONFIG`; a dataset not cached is one line saying how to get it."""
    import json

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    texts = _texts(60)
    _cached_by_load_dataset(tmp_path / "hf", "someone___tiny_corpus", "default", texts, shards=2)
    _cached_by_load_dataset(tmp_path / "hf", "wikitext", "small", texts[:30], shards=1)
    _cached_by_load_dataset(tmp_path / "hf", "wikitext", "large", texts, shards=1)
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    tok = load_tokenizer(DEFAULT_VOCAB)
    load = lambda c: corpus_lib.load_documents(c, tok, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None)  # noqa: E731
    want = load(tmp_path / "c.jsonl")
    for corpus in ("hf:someone/TinyCorpus", "hf:wikitext:large"):
        got = load(corpus)
        for split in ("train", "validation"):
            assert [[s.tolist() for s in d] for d in got[split]] == [[s.tolist() for s in d] for d in want[split]]
    with pytest.raises(UserError, match=r"^hf:wikitext: the datasets cache holds the configurations large, small; name "
                                        r"one, e.g. data.corpus=hf:wikitext:large$"):
        load("hf:wikitext")
    with pytest.raises(UserError, match=r"^hf:bookcorpus is not available locally .*datasets.load_dataset\('bookcorpus', "
                                        r"split='train'\).save_to_disk\(DIR\) and set data.corpus=DIR"):
        load("hf:bookcorpus")
