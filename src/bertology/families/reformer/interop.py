"""The Reformer's Hugging Face record (`ReformerModelWithLMHead` when `is_decoder`, else
`ReformerForMaskedLM`; transformers' `models/reformer`). Both classes hold the same state dict
(`reformer.` trunk, `lm_head.`), so one record serves both and export names the class from
`model.is_decoder`.

Names: the trunk's layers are `reformer.encoder.layers.{i}`, whose attention projections have no
bias: `self_attention.query_key` and `value` in an LSH layer, `query`, `key` and `value` in a
local one (the rows of the kind a layer lacks are skipped); the final norm over the two streams
is `reformer.encoder.layer_norm` (2H); axial position tables are `position_embeddings.weights.{k}`
in HF's broadcastable shapes, which ours keep. The head's bias is the one each transformers line
adds, `lm_head.decoder.bias`: 4.x ties it to `lm_head.bias` (and may save only that), 5.24 gives
the decoder a bias of its own and leaves `lm_head.bias` unused, and 5.23 adds neither (it saves
`lm_head.bias`, which import reads; our logits then differ from 5.23's by that bias, as 4.x and
the original Reformer add it). Export writes the bias under both names, so every line reads it.

The Reformer's own settings (`Settings`: attention layer kinds, hashing, chunks, axial shape,
causality, ...) are one key for one key in `ReformerSettings`; HF's `num_hidden_layers` is the
length of `attn_layers`, and `attention_head_size` our `head_size` (None when it is hidden/heads).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertology.families.reformer.model import ARCHITECTURE, settings
from bertology.interop import names
from bertology.interop.records import Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer

# (our model key, HF key): the Reformer's own settings, one for one
SETTINGS_KEYS = (
    ("attn_layers", "attn_layers"),
    ("num_hashes", "num_hashes"),
    ("num_buckets", "num_buckets"),
    ("lsh_attn_chunk_length", "lsh_attn_chunk_length"),
    ("lsh_num_chunks_before", "lsh_num_chunks_before"),
    ("lsh_num_chunks_after", "lsh_num_chunks_after"),
    ("local_attn_chunk_length", "local_attn_chunk_length"),
    ("local_num_chunks_before", "local_num_chunks_before"),
    ("local_num_chunks_after", "local_num_chunks_after"),
    ("lsh_attention_dropout_rate", "lsh_attention_probs_dropout_prob"),
    ("axial_pos_embds", "axial_pos_embds"),
    ("axial_pos_shape", "axial_pos_shape"),
    ("axial_pos_embds_dim", "axial_pos_embds_dim"),
    ("axial_norm_std", "axial_norm_std"),
    ("chunk_size_feed_forward", "chunk_size_feed_forward"),
    ("is_decoder", "is_decoder"),
    ("hash_seed", "hash_seed"),
)
ARCHITECTURES = {True: "ReformerModelWithLMHead", False: "ReformerForMaskedLM"}  # by is_decoder


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True)
class ReformerSettings:
    """`SETTINGS_KEYS` both ways (lists in config.json; HF's null for an LSH setting of a model
    without LSH layers means transformers' default), the depth from `attn_layers`, the head width
    (`attention_head_size`, free in HF), and the exported class from `is_decoder`."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        main = next(iter(hf.values()))
        for ours, key in SETTINGS_KEYS:
            value = main.get(key)
            if value is None and key not in ("num_buckets", "hash_seed"):  # null: the default
                value = REFORMER_DEFAULTS[key]
            block[ours] = _listed(value)
        block["num_layers"] = len(block["attn_layers"])
        head = main["attention_head_size"]
        block["head_size"] = None if head * block["num_heads"] == block["hidden_size"] else head

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        s = settings(block, cfg)
        hf.update({key: _listed(getattr(s, ours)) for ours, key in SETTINGS_KEYS})
        hf.update(num_hidden_layers=cfg.num_layers, attention_head_size=cfg.head_dim,
                  architectures=[ARCHITECTURES[s.is_decoder]])
        if tokenizer is not None:
            hf.update(pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id)


REFORMER_EMBEDDINGS = (
    ("embeddings/token", "embeddings.word_embeddings", "embedding"),
    ("embeddings/position", "embeddings.position_embeddings.embedding", "embedding"),
    *((f"embeddings/axial_{k}", f"embeddings.position_embeddings.weights.{k}", "tensor") for k in range(8)),
)
REFORMER_LAYER = (
    ("attention_{i}/norm", "encoder.layers.{i}.attention.layer_norm", "norm"),
    ("attention_{i}/query_key", "encoder.layers.{i}.attention.self_attention.query_key", "to_heads"),  # LSH
    ("attention_{i}/query", "encoder.layers.{i}.attention.self_attention.query", "to_heads"),  # local
    ("attention_{i}/key", "encoder.layers.{i}.attention.self_attention.key", "to_heads"),  # local
    ("attention_{i}/value", "encoder.layers.{i}.attention.self_attention.value", "to_heads"),
    ("attention_{i}/output", "encoder.layers.{i}.attention.output.dense", "from_heads"),
    ("ffn_{i}/norm", "encoder.layers.{i}.feed_forward.layer_norm", "norm"),
    ("ffn_{i}/intermediate", "encoder.layers.{i}.feed_forward.dense.dense", "dense"),
    ("ffn_{i}/output", "encoder.layers.{i}.feed_forward.output.dense", "dense"),
)
REFORMER_FINAL_NORM = (("final_norm", "encoder.layer_norm", "norm"),)
REFORMER_HEAD = (  # relative to the model root
    ("lm_head/decoder", "lm_head.decoder", "dense"),  # no bias on our side: only the weight
    ("lm_head/bias", "lm_head.decoder.bias", "tensor"),
)

# transformers 4.57.6's ReformerConfig() for every key read here
REFORMER_DEFAULTS = dict(
    vocab_size=320, hidden_size=256, num_attention_heads=12, attention_head_size=64, feed_forward_size=512,
    max_position_embeddings=4096, hidden_dropout_prob=0.05, local_attention_probs_dropout_prob=0.05,
    lsh_attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, initializer_range=0.02, hidden_act="relu",
    attn_layers=["local", "lsh", "local", "lsh", "local", "lsh"], num_hashes=1, num_buckets=None,
    lsh_attn_chunk_length=64, lsh_num_chunks_before=1, lsh_num_chunks_after=0, local_attn_chunk_length=64,
    local_num_chunks_before=1, local_num_chunks_after=0, axial_pos_embds=True, axial_pos_shape=(64, 64),
    axial_pos_embds_dim=(64, 192), axial_norm_std=1.0, chunk_size_feed_forward=0, is_decoder=False, hash_seed=None,
    tie_word_embeddings=False,
)

REFORMER = HFModel(
    "reformer", "reformer", {"model": ARCHITECTURES[True]},
    layout=(names.Part("model", "reformer", "reformer", (REFORMER_EMBEDDINGS, REFORMER_LAYER, REFORMER_FINAL_NORM),
                       trunk=True),
            names.Part("model", "", "", (REFORMER_HEAD,), trunk=False)),
    prefix="reformer",
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"), ("num_heads", "num_attention_heads"),
          ("intermediate_size", "feed_forward_size"), ("max_position_embeddings", "max_position_embeddings"),
          ("dropout_rate", "hidden_dropout_prob"), ("attention_dropout_rate", "local_attention_probs_dropout_prob"),
          ("layer_norm_eps", "layer_norm_eps"), ("initializer_range", "initializer_range")),
    activation=("hidden_act", {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_python": "gelu",
                               "gelu_pytorch_tanh": "gelu_tanh"}),
    fixed={k: v for k, v in ARCHITECTURE.items() if k not in ("remat", "attention_backend")},
    defaults=REFORMER_DEFAULTS, tokenizer="ReformerTokenizer",
    required=dict(tie_word_embeddings=False),  # the head is 2H wide: HF cannot tie it either
    translations=(ReformerSettings(),),
    tied_if_absent={"lm_head.decoder.bias": "lm_head.bias"},  # 4.x and 5.23 checkpoints
    copies={"lm_head.bias": "lm_head.decoder.bias"},
)

HF_RECORDS = (REFORMER,)
