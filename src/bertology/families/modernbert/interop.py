"""ModernBERT's Hugging Face record (`ModernBertForMaskedLM`, transformers' `models/modernbert`).

HF fuses what the core keeps apart: `attn.Wqkv` is one Linear [3H, H] holding the query, key
and value projections in that order (`qkv.view(bs, -1, 3, heads, head_dim)`), and `mlp.Wi` one
Linear [2I, H] holding the GeGLU's input (first half, through the GELU) and gate (second half):
the fused rows `(j, n)` of `names`. Layer 0 has no `attn_norm` (an `nn.Identity`), which the
name table's row for it skips since our first layer has none either (`first_attention_norm=False`).
Which layers are global and each kind's rotary base are written differently by transformers 4
and 5 (`LayerKinds`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.errors import UserError
from bertology.interop import names
from bertology.interop.records import CORE, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """ModernBertConfig's special ids default to the OLMo tokenizer's (pad 50283, cls 50281, sep
    50282), outside a smaller table, where HF's embedding refuses the padding index: export names
    the run tokenizer's ids ([CLS] begins, [SEP] ends), or none without a tokenizer. They do not
    change what the network computes, so import reads none of them."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        pass

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if tokenizer is None:
            hf.update(pad_token_id=None, cls_token_id=None, sep_token_id=None, bos_token_id=None, eos_token_id=None)
        else:
            hf.update(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id,
                      bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)


# transformers' ModernBertConfig() for the keys `LayerKinds` reads: 4.57.6's defaults, and 5's
# (`default_theta`; `layer_types` built from a `global_attn_every_n_layers` of 3)
LAYER_DEFAULTS = dict(global_rope_theta=160000.0, local_rope_theta=10000.0, global_attn_every_n_layers=3)
ROPE_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}  # 5's kind: 4's key


def layer_types(n: int, layers: int) -> list[str]:
    """transformers 5's `layer_types` for 4's `global_attn_every_n_layers` (5's own conversion)."""
    return ["sliding_attention" if i % n else "full_attention" for i in range(layers)]


@dataclasses.dataclass(frozen=True)
class LayerKinds:
    """Layer i is global when i % `global_attn_every_n_layers` == 0, with base `rope_theta`, the
    others local with base `local_rope_theta`. transformers 4 writes `global_attn_every_n_layers`,
    `global_rope_theta` and `local_rope_theta` (null: the global base); transformers 5 writes
    `layer_types` (one "full_attention" or "sliding_attention" a layer) and `rope_parameters` by
    layer type (`{"full_attention": {"rope_type": "default", "rope_theta": 160000.0}, ...}`), and
    reads 4's keys where those are missing. Import reads either, 5's first; export writes both, so
    each version loads the same model. RoPE scaling (another `rope_type`) is not reproduced."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        main, path = next(iter(hf.values())), next(iter(where.values()))
        old = {key: main.get(key, default) for key, default in LAYER_DEFAULTS.items()}  # 4's, then 5's over them
        for kind, key in ROPE_KEYS.items():
            rope = {**(main.get("rope_scaling") or {}), **((main.get("rope_parameters") or {}).get(kind) or {})}
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                raise UserError(f"{path}: {kind} rope {rope} is not reproduced (we compute the default rope_type)")
            old[key] = rope.get("rope_theta", old[key])
        n, types = old["global_attn_every_n_layers"], main.get("layer_types")
        if types is not None and types != layer_types(n, len(types)):
            n = next((m for m in range(1, len(types) + 1) if types == layer_types(m, len(types))), None)
            if n is None:
                raise UserError(f"{path}: layer_types={types} is not reproduced (we have full_attention every "
                                "n-th layer from the first, sliding_attention in the others)")
        block.update(rope_theta=old["global_rope_theta"], local_rope_theta=old["local_rope_theta"],
                     global_attn_every_n_layers=n)

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        n = cfg.global_attn_every_n_layers
        local = cfg.rope_theta if cfg.local_rope_theta is None else cfg.local_rope_theta  # 5 has no null base
        thetas = {"full_attention": cfg.rope_theta, "sliding_attention": local}
        hf.update(global_attn_every_n_layers=n, global_rope_theta=cfg.rope_theta, local_rope_theta=local,
                  layer_types=layer_types(n, cfg.num_layers),
                  rope_parameters={kind: {"rope_type": "default", "rope_theta": t} for kind, t in thetas.items()})


MODERNBERT_EMBEDDINGS = (
    ("embeddings/token", "embeddings.tok_embeddings", "embedding"),
    ("embeddings/norm", "embeddings.norm", "norm"),
)
MODERNBERT_LAYER = (
    ("attention_{i}/norm", "layers.{i}.attn_norm", "norm"),  # absent at layer 0, on both sides
    ("attention_{i}/query", "layers.{i}.attn.Wqkv", "to_heads", (0, 3)),
    ("attention_{i}/key", "layers.{i}.attn.Wqkv", "to_heads", (1, 3)),
    ("attention_{i}/value", "layers.{i}.attn.Wqkv", "to_heads", (2, 3)),
    ("attention_{i}/output", "layers.{i}.attn.Wo", "from_heads"),
    ("ffn_{i}/norm", "layers.{i}.mlp_norm", "norm"),
    ("ffn_{i}/intermediate", "layers.{i}.mlp.Wi", "dense", (0, 2)),
    ("ffn_{i}/intermediate_linear", "layers.{i}.mlp.Wi", "dense", (1, 2)),
    ("ffn_{i}/output", "layers.{i}.mlp.Wo", "dense"),
)
MODERNBERT_FINAL_NORM = (("final_norm", "final_norm", "norm"),)
MODERNBERT_HEADS = (  # relative to the model root
    ("mlm/transform", "head.dense", "dense"),
    ("mlm/norm", "head.norm", "norm"),
    ("mlm/bias", "decoder.bias", "tensor"),
)

MODERNBERT_KEYS = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("layer_norm_eps", "norm_eps"),
    ("initializer_range", "initializer_range"),
    ("local_attention", "local_attention"),
)

# transformers' ModernBertConfig() (4.57.6 and 5) for every key read here but `LayerKinds`' ones
MODERNBERT_DEFAULTS = dict(
    vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
    hidden_activation="gelu", max_position_embeddings=8192, initializer_range=0.02, norm_eps=1e-5, norm_bias=False,
    attention_bias=False, attention_dropout=0.0, local_attention=128, embedding_dropout=0.0, mlp_bias=False,
    mlp_dropout=0.0, decoder_bias=True, classifier_bias=False, classifier_activation="gelu",
)

MODERNBERT = HFModel(
    "modernbert", "modernbert", {"model": "ModernBertForMaskedLM"},
    layout=(names.Part("model", "encoder", "model", (MODERNBERT_EMBEDDINGS, MODERNBERT_LAYER, MODERNBERT_FINAL_NORM),
                       trunk=True),
            names.Part("model", "", "", (MODERNBERT_HEADS,), trunk=False)),
    prefix="model", keys=MODERNBERT_KEYS,
    activation=("hidden_activation", {"gelu": "geglu"}),  # ACT2FN["gelu"]: the erf GELU, gating the input half
    fixed={**{k: v for k, v in CORE.items() if k not in ("use_bias", "positions")},
           "norm": "pre", "embedding_norm": True, "first_attention_norm": False, "use_bias": False,
           "norm_bias": False, "positions": "rotary", "type_vocab_size": 0, "pooler": False,
           # HF's dropouts sit elsewhere than ours (after the GELU, on the embeddings, on the attention
           # output); ModernBERT trains without any, so both sides have none
           "dropout_rate": 0.0, "attention_dropout_rate": 0.0},
    imported={"scale_residual_init": True},  # HF's init: the output projections' std / sqrt(2 · layers)
    defaults=MODERNBERT_DEFAULTS, tokenizer="PreTrainedTokenizerFast",
    required=dict(norm_bias=False, attention_bias=False, mlp_bias=False, decoder_bias=True, classifier_bias=False,
                  classifier_activation="gelu", attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0),
    translations=(LayerKinds(), SpecialTokens()),
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
)

HF_RECORDS = (MODERNBERT,)
