"""The long-range task (`bertology.tasks.long_range`): the label is in the whole document and not
in its first 512 tokens, under the tokenizer its configs use; the classes are balanced; the
documents are the same on every load."""

import collections
import pathlib

import helpers
import numpy as np

from bertology import sweep, tasks
from bertology.data.tokenizers import for_data
from bertology.tasks import long_range
from bertology.tasks.encode import encode_pair

CONFIG = helpers.REPO / "configs" / "finetune" / "long_range.py"


def test_the_key_is_past_the_first_512_tokens_and_inside_the_4096_token_row():
    config = sweep.load_config(pathlib.Path(CONFIG), "longformer_4096")
    tokenizer = for_data(config.data)
    task = tasks.get("long_range")
    splits = task.load(None, None, log=lambda _: None, long_range_train=4, long_range_eval=4)
    assert collections.Counter(e["label"] for e in splits["train"]) == {k: 1 for k in range(4)}
    assert collections.Counter(e["label"] for e in splits["validation"]) == {k: 1 for k in range(4)}
    for e in splits["train"]:
        words = e["text_a"].split()
        key = long_range.KEY.format(task.labels[e["label"]])
        assert " ".join(words[e["key_word"]:e["key_word"] + len(key.split())]) == key
        # [CLS] + the tokens before the key: the key starts past a 512-token row, and ends inside a 4096-token one
        assert 1 + len(tokenizer.encode(" ".join(words[:e["key_word"]]))) >= 512
        assert 1 + len(tokenizer.encode(" ".join(words[:e["key_word"] + len(key.split())]))) <= 4095
        short, full = (tokenizer.decode(encode_pair(tokenizer, e["text_a"], "", n)["input_ids"].tolist())
                       for n in (512, 4096))
        named = [w for w in task.labels if w in full]
        assert named == [task.labels[e["label"]]], named  # the only class word in the document is the label's
        assert not any(w in short for w in task.labels)
    again = task.load(None, None, log=lambda _: None, long_range_train=4, long_range_eval=4)
    assert again == splits
    other = task.load(None, None, log=lambda _: None, long_range_train=4, long_range_eval=4, long_range_seed=1)
    assert other["train"] != splits["train"]
    assert np.mean([len(e["text_a"]) for e in splits["train"]]) > 10_000  # ~4,096 tokens of text


def test_the_reformers_first_stage_reaches_the_key_only_through_its_hash_buckets():
    """The Reformer's short stage must train the hashing the long documents need: on its 128-token
    documents the key lies outside what the first token sees in its local layer (its own chunk and
    the adjacent ones, circularly as `lsh.look_adjacent`) and outside the LSH layer's reach without
    hashing (a chunk and its neighbours cover a few tokens of the row). With 64-token chunks the
    local view was the whole row: the short task learned, the long one stayed at chance."""
    from bertology.models import lsh

    config = sweep.load_config(pathlib.Path(CONFIG), "reformer_short")
    m, length = config.model, config.data.max_seq_length
    assert m.local_attn_chunk_length == m.lsh_attn_chunk_length  # the stage-2 run takes this block as it is
    chunks = np.arange(length).reshape(-1, m.local_attn_chunk_length)
    seen = set(lsh.look_adjacent(chunks, m.get("local_num_chunks_before", 1), m.local_num_chunks_after, axis=0)[0].tolist())
    lsh_reach = m.lsh_attn_chunk_length * (1 + m.get("lsh_num_chunks_before", 1) + m.lsh_num_chunks_after)
    assert lsh_reach <= length // 4, lsh_reach
    tokenizer = for_data(config.data)
    options = {k: v for k, v in config.data.items() if k.startswith("long_range_")}
    rows = tasks.get("long_range").load(None, None, log=lambda _: None, **{**options, "long_range_train": 200})["train"]
    keys = [1 + len(tokenizer.encode(" ".join(e["text_a"].split()[:e["key_word"]]))) for e in rows]
    assert min(keys) > max(p for p in seen if p < length // 2)  # never in the first chunks
    in_view = np.mean([key in seen for key in keys])
    assert in_view < 0.1, in_view  # the last chunk, seen circularly, holds a key now and then
    # each training document once: 1,000 documents over 4 epochs were learned by heart (100% on the
    # training batches, 29.5% on the validation documents)
    assert config.epochs == 1
