"""Our `t5` family's Hugging Face records: T5 (`T5ForConditionalGeneration`; v1.0 and v1.1
differ only in settings) first, then mT5 (`MT5ForConditionalGeneration`), the same network.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertology.errors import UserError
from bertology.interop import hf_config, names
from bertology.interop.records import CORE, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer

# T5, T5 v1.1 and mT5: `block.{i}.layer.{j}` numbers the sublayers of a block (self-attention,
# [cross-attention,] feed-forward); only the first block holds the stack's relative bias table.
T5_STACK = (
    ("relative_bias", "block.0.layer.0.SelfAttention.relative_attention_bias", "embedding"),
    ("final_norm", "final_layer_norm", "norm"),
)
T5_SELF_ATTENTION = (
    ("attention_{i}/norm", "block.{i}.layer.0.layer_norm", "norm"),
    ("attention_{i}/query", "block.{i}.layer.0.SelfAttention.q", "to_heads"),
    ("attention_{i}/key", "block.{i}.layer.0.SelfAttention.k", "to_heads"),
    ("attention_{i}/value", "block.{i}.layer.0.SelfAttention.v", "to_heads"),
    ("attention_{i}/output", "block.{i}.layer.0.SelfAttention.o", "from_heads"),
)
T5_CROSS_ATTENTION = (
    ("cross_attention_{i}/norm", "block.{i}.layer.1.layer_norm", "norm"),
    ("cross_attention_{i}/query", "block.{i}.layer.1.EncDecAttention.q", "to_heads"),
    ("cross_attention_{i}/key", "block.{i}.layer.1.EncDecAttention.k", "to_heads"),
    ("cross_attention_{i}/value", "block.{i}.layer.1.EncDecAttention.v", "to_heads"),
    ("cross_attention_{i}/output", "block.{i}.layer.1.EncDecAttention.o", "from_heads"),
)


def t5_ffn(sublayer: int, gated: bool) -> tuple[names.Row, ...]:
    """T5's feed-forward block, sublayer 1 of an encoder block and 2 of a decoder block; v1.1's
    gated form names its two input projections wi_0 (the activated one) and wi_1."""
    prefix = f"block.{{i}}.layer.{sublayer}"
    inputs = ((("ffn_{i}/intermediate", f"{prefix}.DenseReluDense.wi_0", "dense"),
               ("ffn_{i}/intermediate_linear", f"{prefix}.DenseReluDense.wi_1", "dense")) if gated
              else (("ffn_{i}/intermediate", f"{prefix}.DenseReluDense.wi", "dense"),))
    return (("ffn_{i}/norm", f"{prefix}.layer_norm", "norm"), *inputs,
            ("ffn_{i}/output", f"{prefix}.DenseReluDense.wo", "dense"))


T5_HEAD = (("lm_head", "lm_head", "dense"),)  # v1.1 and mT5 only: v1.0 ties it to `shared`


@dataclasses.dataclass(frozen=True)
class HeadSize:
    """T5's `d_kv`, the width of one head, which need not be d_model / num_heads (mT5-small: 512, 6, 64)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        block["head_size"] = hf_config._main(hf)["d_kv"]

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf["d_kv"] = cfg.head_dim


@dataclasses.dataclass(frozen=True)
class FeedForwardProj:
    """T5 derives its activation (`dense_act_fn`) from `feed_forward_proj` ('gated-gelu' means the
    tanh GELU); a config that overrides it with anything else computes something we do not."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        proj = hf_config._main(hf)["feed_forward_proj"]
        derived = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
        got = hf_config._main(hf).get("dense_act_fn", derived)
        if got != derived:
            raise UserError(f"{hf_config._main(where)}: dense_act_fn={got!r} with feed_forward_proj={proj!r} is not "
                            f"reproduced (we compute {derived!r}); the checkpoint cannot be imported without changing "
                            "its outputs")

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class TiedOutput:
    """T5 v1.0 ties its output layer to the token table and scales the decoder states by
    d_model**-0.5; v1.1 and mT5 have an untied `lm_head` and no scaling: our `model.tie_embeddings`.

    transformers 5 writes `tie_word_embeddings: true` for every T5 and mT5 (it ties `lm_head` only
    where the checkpoint holds none, or one equal to the token table), keeps T5's scaling in
    `scale_decoder_outputs`, and never scales mT5. So the scaling is read from
    `scale_decoder_outputs` where a config has it, an mT5 config that transformers 5 wrote is
    unscaled, and `default` is the type's value where config.json has neither key. Export writes
    `tie_word_embeddings`, which both lines read as this switch."""

    default: bool
    scales_before_v5_only: bool = False

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        main = hf_config._main(hf)
        scaled = main.get("scale_decoder_outputs", main.get("tie_word_embeddings", self.default))
        if self.scales_before_v5_only and int(str(main.get("transformers_version", "4")).split(".")[0]) >= 5:
            scaled = False
        block["tie_embeddings"] = bool(scaled)

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        hf["tie_word_embeddings"] = bool(block.get("tie_embeddings", True))


T5_KEYS = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "d_model"),
    ("num_layers", "num_layers"),
    ("num_heads", "num_heads"),
    ("intermediate_size", "d_ff"),
    ("dropout_rate", "dropout_rate"),
    ("layer_norm_eps", "layer_norm_epsilon"),
    ("relative_buckets", "relative_attention_num_buckets"),
    ("relative_max_distance", "relative_attention_max_distance"),
)
T5_FIXED = {**{k: v for k, v in CORE.items() if k not in ("head_size", "activation_dropout_rate")},
            "norm": "pre", "norm_kind": "rmsnorm", "use_bias": False, "positions": "relative_bias", "type_vocab_size": 0,
            "embedding_norm": False,
            "scale_attention": False}


T5_DEFAULTS = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu")


GATED = "ffn_0/intermediate_linear"  # the module only v1.1's gated feed-forward has


def _t5_layout() -> tuple[names.Part, ...]:
    """T5's names: `shared`, then `encoder.` and `decoder.` (no trunk prefix), and v1.1's lm_head."""
    parts = [names.Part("model", "encoder", "", (names.SHARED_TOKENS,), trunk=True)]
    for stack, sublayer, tables in (("encoder", 1, (T5_STACK, T5_SELF_ATTENTION)),
                                    ("decoder", 2, (T5_STACK, T5_SELF_ATTENTION,
                                                    T5_CROSS_ATTENTION))):
        parts += [names.Part("model", stack, stack, tables, trunk=True),
                  names.Part("model", stack, stack, (t5_ffn(sublayer, gated=False),), trunk=True,
                             excludes=GATED),
                  names.Part("model", stack, stack, (t5_ffn(sublayer, gated=True),), trunk=True,
                             requires=GATED)]
    return (*parts, names.Part("model", "", "", (T5_HEAD,), trunk=True))


def _t5(model_type: str, architecture: str, defaults: dict[str, Any], tied: TiedOutput) -> HFModel:
    return HFModel(
        model_type, "t5", {"model": architecture}, layout=_t5_layout(), prefix="", keys=T5_KEYS,
        activation=("feed_forward_proj", {"relu": "relu", "gated-gelu": "gated_gelu", "gelu": "gelu"}),
        fixed=T5_FIXED, imported={"pooler": False, "init_scheme": "fan_in"}, defaults=defaults, tokenizer="T5Tokenizer",
        written={"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "is_encoder_decoder": True},
        translations=(HeadSize(), hf_config.OneDropout(), FeedForwardProj(),
                      tied, hf_config.DecoderDepth("num_decoder_layers")),
        tied={"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"},
        tied_if_absent={"lm_head.weight": "shared.weight"},
        generates=True,
    )


T5 = _t5("t5", "T5ForConditionalGeneration", T5_DEFAULTS, TiedOutput(default=True))
MT5 = _t5("mt5", "MT5ForConditionalGeneration",
          {**T5_DEFAULTS, "vocab_size": 250112, "d_ff": 1024, "num_layers": 8, "num_heads": 6,
           "feed_forward_proj": "gated-gelu"}, TiedOutput(default=False, scales_before_v5_only=True))


HF_RECORDS = (T5, MT5)
