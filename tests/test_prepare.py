"""Parallel preparation: the same records for any number of workers, every input format, bad files named."""

import json

import numpy as np
import pytest

from bertology.data import corpus as corpus_lib
from bertology.data import prepare
from bertology.data.embedded import DEFAULT_VOCAB
from bertology.data.tokenizers import load_tokenizer
from bertology.errors import UserError

TOK = load_tokenizer(DEFAULT_VOCAB)


def write_text(path, docs):
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")


def make_docs(n, offset=0):
    return [[f"Document {d} opens with sentence {k}." for k in range(1 + d % 4)] for d in range(offset, offset + n)]


def test_workers_write_the_same_shards_as_one_process(tmp_path, monkeypatch):
    """Two files cut into many small tasks: 1 and 2 workers give byte-identical shards, and the
    records are the documents of the files in order, tokenized sentence by sentence."""
    docs = make_docs(300)
    (tmp_path / "c").mkdir()
    write_text(tmp_path / "c" / "a.txt", docs[:170])
    write_text(tmp_path / "c" / "b.txt", docs[170:])
    files = corpus_lib.corpus_files(tmp_path / "c")
    tasks = prepare.plan(tmp_path / "c", files, chunk_bytes=1000)
    assert len(tasks) > 8
    one = prepare.prepare(tasks, TOK, tmp_path / "one", workers=1, progress=False)
    two = prepare.prepare(tasks, TOK, tmp_path / "two", workers=2, progress=False)
    assert one["documents"] == two["documents"] and sum(one["documents"]) == 300
    for name in one["shards"]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    from grain.python import ArrayRecordDataSource

    source = ArrayRecordDataSource([str(tmp_path / "one" / n) for n in one["shards"]])
    assert len(source) == 300
    for d in (0, 1, 169, 170, 299):
        assert [s.tolist() for s in prepare.decode(source[d])] == [TOK.encode(s) for s in docs[d]]


def test_text_chunks_end_at_blank_lines(tmp_path):
    docs = make_docs(50)
    write_text(tmp_path / "a.txt", docs)
    tasks = prepare.plan(tmp_path / "a.txt", [tmp_path / "a.txt"], chunk_bytes=300)
    read = [doc for task in tasks for doc in prepare.task_documents(task)]
    assert read == docs


def test_json_lines_split_into_sentences(tmp_path):
    texts = ["It rained. Then it stopped! Dr. smith stayed?  Yes.", "One line\nand a second line.", "Numbers 3.5 stay whole."]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)) + "\n")
    tasks = prepare.plan(tmp_path / "a.jsonl", [tmp_path / "a.jsonl"])
    assert list(prepare.task_documents(tasks[0])) == [
        ["It rained.", "Then it stopped!", "Dr. smith stayed?", "Yes."],
        ["One line", "and a second line."],
        ["Numbers 3.5 stay whole."],
    ]


def test_a_bad_json_line_names_the_file(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "ok.jsonl").write_text("\n".join(json.dumps({"text": f"Doc {i}. Two."}) for i in range(5)))
    (tmp_path / "c" / "bad.jsonl").write_text('{"text": "fine."}\n{"body": "no text field"}\n')
    with pytest.raises(UserError, match=r"bad\.jsonl: line 2 .* string 'text' field"):
        corpus_lib.load_documents(tmp_path / "c", TOK, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None, workers=1)


def test_a_directory_mixes_text_and_json_lines(tmp_path):
    (tmp_path / "c").mkdir()
    write_text(tmp_path / "c" / "a.txt", make_docs(3))
    (tmp_path / "c" / "b.jsonl").write_text(json.dumps({"text": "Json doc. Second sentence."}) + "\n")
    docs = corpus_lib.load_documents(tmp_path / "c", TOK, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None)
    assert len(docs["train"]) == 3 and len(docs["validation"]) == 1
    assert [s.tolist() for s in docs["validation"][0]] == [TOK.encode("Json doc."), TOK.encode("Second sentence.")]


def test_a_tfds_dataset_by_name_from_a_local_data_dir(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")

    class TinyTexts(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(7):
                yield i, {"text": f"Article {i} begins. It ends here."}

    TinyTexts(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
    corpus = f"tfds:tiny_texts@{tmp_path / 'tfds'}"
    docs = corpus_lib.load_documents(corpus, TOK, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None, workers=2)
    assert len(docs["train"]) == 6 and len(docs["validation"]) == 1
    read = sorted([s.tolist() for s in d] for split in ("train", "validation") for d in docs[split])
    assert read == sorted([TOK.encode(f"Article {i} begins."), TOK.encode("It ends here.")] for i in range(7))
    with pytest.raises(UserError, match="not tfds:NAME@DATA_DIR"):
        corpus_lib.load_documents("tfds:tiny_texts", TOK, DEFAULT_VOCAB, tmp_path / "cache")


def test_documents_are_read_lazily_and_index_like_a_list(tmp_path):
    write_text(tmp_path / "a.txt", make_docs(120))
    docs = corpus_lib.load_documents(tmp_path / "a.txt", TOK, DEFAULT_VOCAB, tmp_path / "cache", log=lambda m: None)
    train, held = docs["train"], docs["validation"]
    assert len(train) == 118 and len(held) == 2
    expected = [d for i, d in enumerate(make_docs(120)) if i not in (49, 99)]
    assert [[s.tolist() for s in d] for d in train[45:55]] == [[TOK.encode(s) for s in d] for d in expected[45:55]]
    assert [s.tolist() for s in train[-1]] == [TOK.encode(s) for s in expected[-1]]
    assert [s.tolist() for s in held[1]] == [TOK.encode(s) for s in make_docs(120)[99]]


def test_documents_read_in_any_order_across_shards(tmp_path):
    """One `read` of indices spread over many shards, unsorted and repeated, returns each
    document at its place (the stream reads a window this way)."""
    docs = make_docs(300)
    write_text(tmp_path / "a.txt", docs)
    meta = prepare.prepare(prepare.plan(tmp_path / "a.txt", [tmp_path / "a.txt"], chunk_bytes=1000), TOK,
                           tmp_path / "out", workers=1, progress=False)
    shards = [(str(tmp_path / "out" / name), n) for name, n in zip(meta["shards"], meta["documents"]) if n]
    assert len(shards) > 8
    train = corpus_lib.Documents([p for p, _ in shards], [n for _, n in shards], "train")
    expected = [d for i, d in enumerate(docs) if (i + 1) % corpus_lib.EVAL_EVERY]
    order = np.random.default_rng(0).permutation(len(train)).tolist() + [5, 5, 293]
    got = train.read(order)
    assert [[s.tolist() for s in d] for d in got] == [[TOK.encode(s) for s in expected[i]] for i in order]
    assert [s.tolist() for s in train[200]] == [TOK.encode(s) for s in expected[200]]


def test_the_fast_tokenizer_gives_our_ids(tmp_path):
    """Preparation keeps our WordPiece (faster here than BertTokenizerFast, see the report); it must
    give the same ids as Hugging Face's on the embedded corpus, or the speed comparison is moot."""
    transformers = pytest.importorskip("transformers")
    from bertology.data.embedded import embedded_corpus_path

    lines = [line for line in embedded_corpus_path().read_text().splitlines() if line.strip()][::20]
    # Positional: transformers 5 renamed the first argument `vocab` (a vocab.txt path or a dict) and
    # quietly ignores `vocab_file=`, leaving a five-token vocabulary that maps every word to [UNK].
    fast = transformers.BertTokenizerFast(str(DEFAULT_VOCAB), do_lower_case=True)
    assert fast(lines, add_special_tokens=False)["input_ids"] == [TOK.encode(line) for line in lines]


def test_causal_rows_join_sentences_as_running_text():
    """Sentences tokenized one by one (as preparation does) and joined in a causal row give the
    byte BPE's ids of the text "a b" (GPT-2 writes the space into the next word's token, Ġ), on
    the embedded corpus's first documents; WordPiece documents are left as they are."""
    import ml_collections

    from bertology.data import transforms
    from bertology.data.embedded import BYTE_BPE_VOCAB, embedded_corpus_path

    bpe = load_tokenizer(BYTE_BPE_VOCAB)
    texts = [d for _, d in zip(range(40), corpus_lib.read_documents([embedded_corpus_path()]))]
    texts.append(["It rained.", "(Then  it stopped)", "3 days later.", "'s odd"])
    docs = [[np.array(bpe.encode(s), np.int32) for s in d] for d in texts]
    joined = [np.concatenate(d).tolist() for d in transforms.running_text(docs, bpe)]
    assert joined == [bpe.encode(" ".join(d)) for d in texts]
    assert sum(np.concatenate(d).tolist() != j for d, j in zip(docs, joined)) > 30  # the join did change them

    cfg = ml_collections.ConfigDict({"objective": "causal", "max_seq_length": 64})
    rows = transforms.make(cfg, bpe).instances([docs[-1]], np.random.default_rng(0))
    n = int(rows["input_mask"].sum())
    assert rows["input_ids"][0, :n].tolist() == bpe.encode(" ".join(texts[-1])) + [bpe.eos_id]
    words = [[np.array(TOK.encode(s), np.int32) for s in d] for d in texts[:5]]
    assert [[s.tolist() for s in d] for d in transforms.running_text(words, TOK)] == [[s.tolist() for s in d] for d in words]
