"""`hf:NAME` corpora: a Hugging Face dataset's train split as `datasets` cached it on this machine.

Nothing is downloaded and `datasets` is not imported: `datasets.load_dataset(NAME[, CONFIG])`
leaves each split as Arrow files (read by `tables.py` like any other) under HF_DATASETS_CACHE
(default HF_HOME/datasets, HF_HOME default ~/.cache/huggingface), laid out as
`NAMESPACE___NAME/CONFIG/VERSION/HASH/` holding `dataset_info.json` and `NAME-train.arrow` or
`NAME-train-SSSSS-of-NNNNN.arrow` (the dataset name snake-cased; other Arrow files there, such as
`cache-*.arrow` from `Dataset.map`, are not the split). `hf:NAME` takes the newest HASH directory
of its one cached CONFIG, as `datasets` itself does offline; where several configs are cached,
`hf:NAME:CONFIG` names one. A dataset that is not there is refused with how to get it.
"""

from __future__ import annotations

import json
import os
import pathlib

from bertology.errors import UserError

PREFIX = "hf:"


def cache_root() -> pathlib.Path:
    """Where `datasets` keeps its Arrow cache (its own defaults and environment variables)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return pathlib.Path(os.environ.get("HF_DATASETS_CACHE") or os.path.join(home, "datasets")).expanduser()


def _key(name: str) -> str:
    """A cache directory's name compared without case or underscores: `datasets` snake-cases the
    dataset's name (OpenWebText -> open_web_text) and joins the namespace with ___."""
    return name.lower().replace("_", "")


def train_files(corpus: str) -> list[pathlib.Path]:
    """The Arrow files of the cached train split of `hf:NAME` or `hf:NAME:CONFIG`, in order."""
    name, _, config = corpus[len(PREFIX):].partition(":")
    parts = name.split("/")
    if len(parts) > 2 or not all(parts):
        raise UserError(f"data.corpus={corpus!r} is not hf:NAME or hf:NAME:CONFIG; e.g. hf:wikitext:wikitext-2-raw-v1")
    root = cache_root()
    fix = (f"get it where the Hub is reachable with datasets.load_dataset({name!r}{f', {config!r}' if config else ''}, "
           "split='train').save_to_disk(DIR) and set data.corpus=DIR (or load it once on this machine)")
    wanted = _key("___".join(parts))
    homes = [d for d in root.iterdir() if d.is_dir() and _key(d.name) == wanted] if root.is_dir() else []
    builds = [d for home in homes for d in home.glob(f"{config or '*'}/*/*")
              if (d / "dataset_info.json").is_file() and not d.name.endswith(".incomplete")]
    if not builds:
        raise UserError(f"{corpus} is not available locally (not in the Hugging Face datasets cache {root}; nothing is "
                        f"downloaded); {fix}")
    configs = sorted({d.parent.parent.name for d in builds})
    if len(configs) > 1:
        raise UserError(f"{corpus}: the datasets cache holds the configurations {', '.join(configs)}; name one, "
                        f"e.g. data.corpus=hf:{name}:{configs[0]}")
    build = max(builds, key=lambda d: d.stat().st_mtime)
    splits = json.loads((build / "dataset_info.json").read_text()).get("splits") or {}
    if "train" not in splits:
        raise UserError(f"{corpus}: the cached dataset {build} has no train split (it has {', '.join(splits) or 'none'}); "
                        f"{fix}")
    shards = len(splits["train"].get("shard_lengths") or [None])
    files = sorted(build.glob("*-train.arrow" if shards == 1 else f"*-train-*-of-{shards:05d}.arrow"))
    if len(files) != shards:
        raise UserError(f"{corpus}: the cached train split in {build} has {len(files)} of its {shards} Arrow file(s); "
                        f"load it again, or {fix}")
    return files
