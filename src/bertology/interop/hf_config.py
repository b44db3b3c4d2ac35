"""Hugging Face `config.json` <-> our `model` config block.

Only settings our encoder reproduces exactly are accepted: a checkpoint whose math we would
silently change (another activation, relative positions, ALBERT layer groups) fails with one line
instead of importing into a model that computes something else.
"""

from __future__ import annotations

from typing import Any

from bertology.errors import UserError
from bertology.models.electra import generator_config
from bertology.models.transformer import TransformerConfig

FAMILIES = ("bert", "roberta", "albert", "electra")
# HF hidden_act -> our model.activation (the erf GELU, or its tanh approximation)
ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

SAME_VALUE = (  # (our model.<key>, HF config key): the same number under two names
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("type_vocab_size", "type_vocab_size"),
    ("dropout_rate", "hidden_dropout_prob"),
    ("attention_dropout_rate", "attention_probs_dropout_prob"),
    ("layer_norm_eps", "layer_norm_eps"),
    ("initializer_range", "initializer_range"),
)

ARCHITECTURES = {  # what export writes, per HF checkpoint ("model" or ELECTRA's two)
    ("bert", "model"): "BertForPreTraining",
    ("roberta", "model"): "RobertaForMaskedLM",
    ("albert", "model"): "AlbertForPreTraining",
    ("electra", "discriminator"): "ElectraForPreTraining",
    ("electra", "generator"): "ElectraForMaskedLM",
}


def _check_reproducible(hf: dict[str, Any], where: str) -> None:
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise UserError(f"{where}: hidden_act={act!r} is not reproduced (we have {', '.join(ACTIVATIONS)}); "
                        "the checkpoint cannot be imported without changing its outputs")
    position = hf.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise UserError(f"{where}: position_embedding_type={position!r} is not supported; only absolute positions")
    if hf.get("model_type") == "albert" and (hf.get("num_hidden_groups", 1), hf.get("inner_group_num", 1)) != (1, 1):
        raise UserError(f"{where}: ALBERT with num_hidden_groups/inner_group_num other than 1/1 is not supported")


def from_hf(hf: dict[str, Any], where: str, generator: dict[str, Any] | None = None) -> dict[str, Any]:
    """Our `model` block for an HF config (`where` names it in errors); ELECTRA may add its generator's."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise UserError(f"{where}: model_type {family!r} is not importable; supported: {', '.join(FAMILIES)}")
    if family == "electra" and "ElectraForMaskedLM" in hf.get("architectures", ()):
        raise UserError(f"{where} is an ELECTRA generator; pass the discriminator as --in and this one as --generator")
    _check_reproducible(hf, where)
    defaults = TransformerConfig()
    block: dict[str, Any] = {"family": family}
    block.update({ours: hf.get(key, getattr(defaults, ours)) for ours, key in SAME_VALUE})
    block["activation"] = ACTIVATIONS[hf.get("hidden_act", "gelu")]
    if family == "roberta":  # HF counts positions from padding_idx + 1
        block["position_offset"] = hf.get("pad_token_id", 1) + 1
    if family == "albert":
        block.update(embedding_size=hf.get("embedding_size", 128), share_layers="all")
    if family == "electra":
        embedding = hf.get("embedding_size", block["hidden_size"])
        block.update(embedding_size=embedding if embedding != block["hidden_size"] else None, pooler=False)
        if generator is not None:
            block["generator_fraction"] = _generator_fraction(block, generator, f"{where} (generator)")
    return block


def _generator_fraction(block: dict[str, Any], gen: dict[str, Any], where: str) -> float:
    """The generator_fraction whose generator has exactly the HF generator's shape."""
    _check_reproducible(gen, where)
    disc = TransformerConfig(**{k: v for k, v in block.items() if k != "family"})
    fraction = gen["hidden_size"] / disc.hidden_size
    ours = generator_config(disc, fraction)
    expected = {"hidden_size": ours.hidden_size, "num_hidden_layers": ours.num_layers,
                "num_attention_heads": ours.num_heads, "intermediate_size": ours.intermediate_size,
                "vocab_size": ours.vocab_size, "embedding_size": ours.embed_dim,
                "max_position_embeddings": ours.max_position_embeddings}
    for key, value in expected.items():
        got = gen.get(key, gen["hidden_size"] if key == "embedding_size" else None)
        if got != value:
            raise UserError(f"{where}: {key}={got} but a generator of fraction {fraction:g} of the discriminator "
                            f"has {value}; our ELECTRA generator cannot take this shape")
    return fraction


def to_hf(block: dict[str, Any], cfg: TransformerConfig, source: str) -> dict[str, Any]:
    """The HF config.json of `source` ("model", or ELECTRA's "discriminator"/"generator") with encoder `cfg`."""
    family = block["family"]
    if (family, source) not in ARCHITECTURES:
        raise UserError(f"model family {family!r} has no Hugging Face counterpart; use bert, roberta, albert or electra")
    if cfg.adapter_size:
        raise UserError("a model with adapters (model.adapter_size) has no Hugging Face counterpart")
    sharing = "all" if family == "albert" else "none"
    if cfg.share_layers != sharing:
        raise UserError(f"{family} export needs model.share_layers={sharing!r}, not {cfg.share_layers!r}")
    if (cfg.position_offset > 0) != (family == "roberta"):
        raise UserError(f"{family} export cannot express model.position_offset={cfg.position_offset}")
    if block.get("discriminator_head", "rtd") != "rtd":
        raise UserError("only ELECTRA's replaced-token discriminator head has a Hugging Face counterpart")
    hf: dict[str, Any] = {
        "model_type": family,
        "architectures": [ARCHITECTURES[family, source]],
        "hidden_act": "gelu" if cfg.activation == "gelu" else "gelu_new",
        "position_embedding_type": "absolute",
        "pad_token_id": cfg.position_offset - 1 if family == "roberta" else 0,
        **{key: getattr(cfg, ours) for ours, key in SAME_VALUE},
    }
    if family == "roberta":
        hf.update(bos_token_id=0, eos_token_id=2)
    if family in ("albert", "electra"):
        hf["embedding_size"] = cfg.embed_dim
    if family == "albert":
        hf.update(num_hidden_groups=1, inner_group_num=1)
    return hf
