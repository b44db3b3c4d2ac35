"""The Beam preparation path: DirectRunner writes the same shards as the multi-process path,
and training reads its output directory as a prepared corpus."""

import json

import pytest

from bertology.data import corpus as corpus_lib
from bertology.data import prepare
from bertology.data.embedded import DEFAULT_VOCAB, embedded_corpus_path
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError

beam = pytest.importorskip("apache_beam", reason="apache-beam is not installed (pip install '.[beam]')")
from bertology.data.beam import prepare_beam  # noqa: E402

TOK = load_tokenizer(DEFAULT_VOCAB)


def test_direct_runner_writes_the_multiprocess_shards(tmp_path):
    """The embedded corpus in ~100 kB tasks: every shard byte-identical, the same document counts."""
    corpus = embedded_corpus_path()
    tasks = prepare.plan(corpus, [corpus], chunk_bytes=100_000)
    assert len(tasks) > 10
    digest = corpus_lib.tokenizer_digest(DEFAULT_VOCAB)
    pool = prepare.prepare(tasks, TOK, tmp_path / "pool", workers=2, progress=False, tokenizer_digest=digest)
    direct = prepare_beam(tasks, TOK, tmp_path / "beam", tokenizer_digest=digest,
                          pipeline_args=["--runner=DirectRunner", "--direct_num_workers=2",
                                         "--direct_running_mode=multi_threading"])
    assert direct["shards"] == pool["shards"] and direct["documents"] == pool["documents"]
    assert sum(direct["documents"]) == sum(1 for _ in corpus_lib.read_documents([corpus]))
    for name in pool["shards"]:
        assert (tmp_path / "beam" / name).read_bytes() == (tmp_path / "pool" / name).read_bytes(), name


def test_a_prepared_directory_is_a_corpus_for_its_vocabulary_only(tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(f"Document {d} here.\nIts second line." for d in range(60)) + "\n")
    tasks = prepare.plan(tmp_path / "c.txt", [tmp_path / "c.txt"], chunk_bytes=500)
    prepare_beam(tasks, TOK, tmp_path / "out", tokenizer_digest=corpus_lib.tokenizer_digest(DEFAULT_VOCAB))
    docs = corpus_lib.load_documents(tmp_path / "out", TOK, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None)
    assert len(docs["train"]) == 59 and len(docs["validation"]) == 1
    assert [s.tolist() for s in docs["validation"][0]] == [TOK.encode("Document 49 here."), TOK.encode("Its second line.")]
    assert not (tmp_path / "cache").exists()  # read in place, nothing tokenized again
    other = tmp_path / "other.txt"
    other.write_text(DEFAULT_VOCAB.read_text() + "zzzextra\n")
    with pytest.raises(UserError, match="another vocabulary"):
        corpus_lib.load_documents(tmp_path / "out", TOK, other, tmp_path / "cache", log=lambda m: None)
    assert json.loads((tmp_path / "out" / prepare.META).read_text())["engine"] == "beam"
