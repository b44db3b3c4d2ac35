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
