"""What interop knows about each Hugging Face model type: one record each.

`hf.py` and `hf_config.py` read these records and never ask which family they hold, so a new
model type is a new record: its architectures per checkpoint, its name tables (`names.py`), the
config keys it shares with ours, what it fixes, what it refuses, and the translations
(`hf_config.py`) that apply to it.

Several model types can share our family (`gpt`: GPT-2 is pre-LN, OpenAI GPT post-LN; `t5`: T5,
whose v1.0 and v1.1 differ only in settings, and mT5, the same network); export takes the first
one whose `fixed` settings the run has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from bertology import models
from bertology.errors import UserError
from bertology.families.mobilebert import model as mobilebert
from bertology.interop import hf_config, names
from bertology.interop.hf_config import Translation
from bertology.models.transformer import TransformerConfig


@dataclasses.dataclass(frozen=True)
class HFModel:
    """One HF model type and how it maps onto one of our families.

    - `architectures`: the HF class export writes, per checkpoint ("source") a run splits into;
      the first source is the one `--in` names, the others are optional extra directories.
    - `layout`: the name tables (`names.Part`s).
    - `prefix`: the trunk's state-dict prefix; a bare trunk (`BertModel`, `GPT2Model`) saves its
      names without it.
    - `keys`: (our model key, HF key) pairs holding the same number.
    - `activation`: the HF key naming it and HF name -> our `model.activation`; export writes the
      first name for ours. A key of None: the type has one activation, `{None: ours}` (Transformer-XL).
    - `fixed`: `model` entries this type implies: an import writes them, an export requires them
      (anything else computes differently). `imported`: entries an import writes that do not
      change what the model computes (initialisation, an unused pooler).
    - `required`: HF config values we reproduce only as given: import refuses any other value,
      export writes them. `written`: other HF entries export writes as they are.
    - `defaults`: transformers' value for every HF key read here, for a config.json that omits it.
    - `translations`: the settings that are not one key to one key.
    - `tied`: HF output layers tied to another tensor: never written; on import they must equal it.
    - `pooler`: the HF name of the pooler's weight, whose presence decides `model.pooler`.
    - `tokenizer`: the HF tokenizer class of a checkpoint without a tokenizer_config.json naming one.
    - `source_configs`: how to get the config of a source other than the trunk's (ELECTRA's generator).
    """

    model_type: str
    family: str
    architectures: Mapping[str, str]
    layout: tuple[names.Part, ...]
    prefix: str
    keys: tuple[tuple[str, str], ...]
    activation: tuple[str | None, Mapping[str | None, str]]
    fixed: Mapping[str, Any]
    defaults: Mapping[str, Any]
    tokenizer: str
    imported: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    required: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    written: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    translations: tuple[Translation, ...] = ()
    tied: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pooler: str | None = None
    source_configs: Mapping[str, Callable[[dict[str, Any]], TransformerConfig]] = dataclasses.field(
        default_factory=dict)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(self.architectures)

    def configs(self, block: dict[str, Any]) -> dict[str, TransformerConfig]:
        """The network config of each source of a run with model block `block`."""
        return {source: self.source_configs.get(source, models.encoder_config)(block) for source in self.sources}

    def mismatch(self, cfg: TransformerConfig) -> str | None:
        """The first `fixed` setting `cfg` does not have, as `key=want (not got)`; None if it has all."""
        for key, want in self.fixed.items():
            if getattr(cfg, key) != want:
                return f"model.{key}={want!r} (not {getattr(cfg, key)!r})"
        return None


# HF hidden_act -> our model.activation (the erf GELU, or its tanh approximation)
GELUS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

ENCODER_KEYS = (  # (our model.<key>, HF config key) for the BERT-style configs
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
GPT_KEYS = (  # GPT and GPT-2 (the feed-forward width and the embedding dropout are translations)
    ("vocab_size", "vocab_size"),
    ("hidden_size", "n_embd"),
    ("num_layers", "n_layer"),
    ("num_heads", "n_head"),
    ("max_position_embeddings", "n_positions"),
    ("dropout_rate", "resid_pdrop"),
    ("attention_dropout_rate", "attn_pdrop"),
    ("layer_norm_eps", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)

# What every HF model here computes, and what our core could compute differently.
CORE = dict(norm_kind="layernorm", use_bias=True, positions="absolute", adapter_size=None, scan_layers=False,
            share_layers="none", embedding_size=None, position_offset=0, head_size=None, scale_attention=True,
            scale_embeddings=False, activation_dropout_rate=0.0)
ENCODER = {**CORE, "norm": "post", "embedding_norm": True}
GPT = {**CORE, "type_vocab_size": 0, "embedding_norm": False}

BERT_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12,
                     initializer_range=0.02, hidden_act="gelu", position_embedding_type="absolute")
GPT_DEFAULTS = dict(n_positions=512, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.1, embd_pdrop=0.1,
                    attn_pdrop=0.1, layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True)
GPT2_REQUIRED = dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
                     add_cross_attention=False, tie_word_embeddings=True)
ABSOLUTE = {"position_embedding_type": "absolute"}


def _encoder(model_type: str, architecture: str, heads: tuple[names.Row, ...]) -> tuple:
    """(architectures, layout) of a BERT-style single checkpoint: the trunk under `<model_type>.`,
    then the heads."""
    tables = (names.EMBEDDINGS, names.BERT_LAYER, names.BERT_POOLER)
    return ({"model": architecture},
            (names.Part("model", "encoder", model_type, tables, trunk=True),
             names.Part("model", "", "", (heads,), trunk=False)))


def _generator(block: dict[str, Any]) -> TransformerConfig:
    return models.build(block).generator_cfg


BERT = HFModel(
    "bert", "bert", *_encoder("bert", "BertForPreTraining", names.BERT_HEADS), prefix="bert",
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS), fixed=ENCODER, defaults=BERT_DEFAULTS,
    tokenizer="BertTokenizer", required=ABSOLUTE, written={"pad_token_id": 0},
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="bert.pooler.dense.weight",
)
ROBERTA = HFModel(
    "roberta", "roberta", *_encoder("roberta", "RobertaForMaskedLM", names.ROBERTA_HEADS), prefix="roberta",
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={k: v for k, v in ENCODER.items() if k != "position_offset"},  # PaddingOffset sets it
    defaults={**BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1}, tokenizer="RobertaTokenizer",
    required=ABSOLUTE, translations=(hf_config.PaddingOffset(),),
    tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    pooler="roberta.pooler.dense.weight",
)
ALBERT = HFModel(
    "albert", "albert", {"model": "AlbertForPreTraining"}, prefix="albert",
    layout=(names.Part("model", "encoder", "albert", (names.EMBEDDINGS, names.ALBERT_PROJECTION, names.ALBERT_LAYER,
                                                      names.ALBERT_POOLER), trunk=True),
            names.Part("model", "", "", (names.ALBERT_HEADS,), trunk=False)),
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={**{k: v for k, v in ENCODER.items() if k != "embedding_size"}, "share_layers": "all"},
    defaults={**BERT_DEFAULTS, "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096,
              "num_attention_heads": 64, "intermediate_size": 16384, "hidden_act": "gelu_new",
              "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0, "num_hidden_groups": 1,
              "inner_group_num": 1},
    tokenizer="AlbertTokenizer", required={**ABSOLUTE, "num_hidden_groups": 1, "inner_group_num": 1},
    written={"pad_token_id": 0}, translations=(hf_config.EmbeddingSize(always_projected=True),),
    tied={"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"},
    pooler="albert.pooler.weight",
)
ELECTRA = HFModel(
    "electra", "electra", {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM"},
    prefix="electra",
    layout=(names.Part("discriminator", "discriminator/encoder", "electra",
                       (names.EMBEDDINGS, names.ELECTRA_PROJECTION, names.BERT_LAYER), trunk=True),
            names.Part("discriminator", "", "", (names.DISCRIMINATOR_HEADS,), trunk=False),
            names.Part("generator", "generator/encoder", "electra", (names.ELECTRA_PROJECTION, names.BERT_LAYER),
                       trunk=True),
            names.Part("generator", "discriminator/encoder", "electra", (names.EMBEDDINGS,), trunk=True,
                       export_only=True),
            names.Part("generator", "", "", (names.GENERATOR_HEADS,), trunk=False)),
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS),
    fixed={**{k: v for k, v in ENCODER.items() if k != "embedding_size"}, "pooler": False},
    defaults={**BERT_DEFAULTS, "embedding_size": 128, "hidden_size": 256, "num_attention_heads": 4,
              "intermediate_size": 1024},
    tokenizer="ElectraTokenizer", required=ABSOLUTE, written={"pad_token_id": 0},
    translations=(hf_config.EmbeddingSize(always_projected=False), hf_config.ElectraGenerator()),
    tied={"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"},
    source_configs={"generator": _generator},
)
DISTILBERT = HFModel(
    "distilbert", "distilbert", {"model": "DistilBertForMaskedLM"}, prefix="distilbert",
    layout=(names.Part("model", "encoder", "distilbert", (names.EMBEDDINGS, names.DISTILBERT_LAYER), trunk=True),
            names.Part("model", "", "", (names.DISTILBERT_HEADS,), trunk=False)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "dim"), ("num_layers", "n_layers"), ("num_heads", "n_heads"),
          ("intermediate_size", "hidden_dim"), ("max_position_embeddings", "max_position_embeddings"),
          ("dropout_rate", "dropout"), ("attention_dropout_rate", "attention_dropout"),
          ("initializer_range", "initializer_range")),
    activation=("activation", {**GELUS, "relu": "relu"}),
    # every LayerNorm of DistilBERT has eps 1e-12, not a config key
    fixed={**ENCODER, "type_vocab_size": 0, "pooler": False, "layer_norm_eps": 1e-12},
    defaults=dict(vocab_size=30522, max_position_embeddings=512, sinusoidal_pos_embds=False, n_layers=6, n_heads=12,
                  dim=768, hidden_dim=3072, dropout=0.1, attention_dropout=0.1, activation="gelu",
                  initializer_range=0.02, tie_word_embeddings=True),
    tokenizer="DistilBertTokenizer", required={"sinusoidal_pos_embds": False, "tie_word_embeddings": True},
    written={"pad_token_id": 0},
    tied={"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"},
)
GPT2 = HFModel(
    "gpt2", "gpt", {"model": "GPT2LMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "decoder", "transformer", (names.GPT2_EMBEDDINGS, names.GPT_LAYER, names.FINAL_NORM),
                       trunk=True),),
    keys=GPT_KEYS, activation=("activation_function", GELUS), fixed={"norm": "pre", **GPT},
    imported={"scale_residual_init": True, "pooler": False},
    defaults={**GPT_DEFAULTS, **GPT2_REQUIRED, "vocab_size": 50257, "n_positions": 1024, "n_inner": None,
              "activation_function": "gelu_new"},
    tokenizer="GPT2Tokenizer", required=GPT2_REQUIRED,
    translations=(hf_config.FeedForwardWidth("n_inner"), hf_config.SameValue("embd_pdrop", "resid_pdrop", "dropout_rate"),
                  hf_config.EndOfText()),
    tied={"lm_head.weight": "transformer.wte.weight"},
)
OPENAI_GPT = HFModel(
    "openai-gpt", "gpt", {"model": "OpenAIGPTLMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "decoder", "transformer", (names.OPENAI_GPT_EMBEDDINGS, names.GPT_LAYER),
                       trunk=True),),
    keys=GPT_KEYS, activation=("afn", {"gelu": "gelu_tanh"}),  # its "gelu" is the tanh approximation
    fixed={"norm": "post", **GPT}, imported={"scale_residual_init": False, "pooler": False},
    defaults={**GPT_DEFAULTS, "vocab_size": 40478, "afn": "gelu"},
    tokenizer="OpenAIGPTTokenizer", required={"tie_word_embeddings": True},
    translations=(hf_config.FeedForwardWidth(None), hf_config.SameValue("embd_pdrop", "resid_pdrop", "dropout_rate"),
                  hf_config.EndOfText()),
    tied={"lm_head.weight": "transformer.tokens_embed.weight"},
)

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
                   dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True)
GATED = "ffn_0/intermediate_linear"  # the module only v1.1's gated feed-forward has


def _t5_layout() -> tuple[names.Part, ...]:
    """T5's names: `shared`, then `encoder.` and `decoder.` (no trunk prefix), and v1.1's lm_head."""
    parts = [names.Part("model", "encoder", "", (names.SHARED_TOKENS,), trunk=True)]
    for stack, sublayer, tables in (("encoder", 1, (names.T5_STACK, names.T5_SELF_ATTENTION)),
                                    ("decoder", 2, (names.T5_STACK, names.T5_SELF_ATTENTION,
                                                    names.T5_CROSS_ATTENTION))):
        parts += [names.Part("model", stack, stack, tables, trunk=True),
                  names.Part("model", stack, stack, (names.t5_ffn(sublayer, gated=False),), trunk=True,
                             excludes=GATED),
                  names.Part("model", stack, stack, (names.t5_ffn(sublayer, gated=True),), trunk=True,
                             requires=GATED)]
    return (*parts, names.Part("model", "", "", (names.T5_HEAD,), trunk=True))


def _t5(model_type: str, architecture: str, defaults: dict[str, Any]) -> HFModel:
    return HFModel(
        model_type, "t5", {"model": architecture}, layout=_t5_layout(), prefix="", keys=T5_KEYS,
        activation=("feed_forward_proj", {"relu": "relu", "gated-gelu": "gated_gelu", "gelu": "gelu"}),
        fixed=T5_FIXED, imported={"pooler": False, "init_scheme": "t5"}, defaults=defaults, tokenizer="T5Tokenizer",
        written={"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "is_encoder_decoder": True},
        translations=(hf_config.HeadSize(), hf_config.OneDropout(), hf_config.FeedForwardProj(),
                      hf_config.TiedOutput(), hf_config.DecoderDepth("num_decoder_layers")),
        tied={"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"},
    )


T5 = _t5("t5", "T5ForConditionalGeneration", T5_DEFAULTS)
MT5 = _t5("mt5", "MT5ForConditionalGeneration",
          {**T5_DEFAULTS, "vocab_size": 250112, "d_ff": 1024, "num_layers": 8, "num_heads": 6,
           "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False})
BART = HFModel(
    "bart", "bart", {"model": "BartForConditionalGeneration"}, prefix="model",
    layout=(names.Part("model", "encoder", "model", (names.SHARED_TOKENS,), trunk=True),
            names.Part("model", "encoder", "model.encoder", (names.BART_EMBEDDINGS, names.BART_LAYER), trunk=True),
            names.Part("model", "decoder", "model.decoder",
                       (names.BART_EMBEDDINGS, names.BART_LAYER, names.BART_CROSS_ATTENTION), trunk=True),
            names.Part("model", "", "", (names.BART_HEAD,), trunk=False)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "d_model"), ("num_layers", "encoder_layers"),
          ("num_heads", "encoder_attention_heads"), ("intermediate_size", "encoder_ffn_dim"),
          ("dropout_rate", "dropout"), ("attention_dropout_rate", "attention_dropout"),
          ("activation_dropout_rate", "activation_dropout"), ("initializer_range", "init_std"),
          ("scale_embeddings", "scale_embedding")),
    activation=("activation_function", {**GELUS, "relu": "relu"}),
    fixed={**{k: v for k, v in CORE.items() if k not in ("position_offset", "scale_embeddings",
                                                         "activation_dropout_rate")},
           "norm": "post", "embedding_norm": True, "type_vocab_size": 0, "layer_norm_eps": 1e-5},
    imported={"pooler": False},
    defaults=dict(vocab_size=50265, max_position_embeddings=1024, d_model=1024, encoder_layers=12,
                  decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                  decoder_ffn_dim=4096, encoder_layerdrop=0.0, decoder_layerdrop=0.0, activation_function="gelu",
                  dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, init_std=0.02, scale_embedding=False,
                  tie_word_embeddings=True),
    tokenizer="BartTokenizer",
    required={"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "tie_word_embeddings": True},
    written={"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
             "forced_eos_token_id": 2, "is_encoder_decoder": True},
    translations=(hf_config.PositionTableOffset(),
                  hf_config.DecoderDepth("decoder_layers"),
                  hf_config.SameValue("decoder_attention_heads", "encoder_attention_heads", "num_heads"),
                  hf_config.SameValue("decoder_ffn_dim", "encoder_ffn_dim", "intermediate_size")),
    tied={"model.encoder.embed_tokens.weight": "model.shared.weight",
          "model.decoder.embed_tokens.weight": "model.shared.weight", "lm_head.weight": "model.shared.weight"},
)


@dataclasses.dataclass(frozen=True)
class Recurrent:
    """Transformer-XL's and XLNet's settings beyond the Transformer's: the memory and relative
    attention keys (`keys`: (our model key, HF key, our default); HF's null means our default),
    the head width `d_head`, and the feed-forward dropout, which HF applies at the rate of the
    residual dropout. HF XLNet always has per-layer relative biases, so `untied` refuses to
    export a run that shares them (`model.untie_r=False`)."""

    keys: tuple[tuple[str, str, Any], ...]
    untied: bool = False

    def from_hf(self, hf: hf_config.BySource, block: hf_config.Block, where: dict[str, str]) -> None:
        main = hf_config._main(hf)
        block.update({ours: default if main.get(key) is None else main[key] for ours, key, default in self.keys})
        block["head_size"] = None if main["d_head"] * block["num_heads"] == block["hidden_size"] else main["d_head"]
        block["activation_dropout_rate"] = block["dropout_rate"]

    def to_hf(self, block: hf_config.Block, cfg: TransformerConfig, hf: hf_config.HFConfig,
              tokenizer: Any) -> None:
        if self.untied and not block.get("untie_r", True):
            raise UserError(f"{hf['model_type']} has relative biases per layer; export needs model.untie_r=True")
        hf.update({key: block.get(ours, default) for ours, key, default in self.keys}, d_head=cfg.head_dim)


RELATIVE = {**{k: v for k, v in CORE.items() if k not in ("positions", "scale_embeddings", "activation_dropout_rate")},
            "positions": "none", "norm": "post", "type_vocab_size": 0, "embedding_norm": False}
TRANSFO_XL = HFModel(
    "transfo-xl", "transfo_xl", {"model": "TransfoXLLMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "", "transformer", (names.TRANSFO_XL_EMBEDDINGS, names.TRANSFO_XL_SHARED_BIASES,
                                                    names.TRANSFO_XL_LAYER), trunk=True),
            names.Part("model", "", "", (names.TRANSFO_XL_HEAD,), trunk=True)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "d_model"), ("num_layers", "n_layer"), ("num_heads", "n_head"),
          ("intermediate_size", "d_inner"), ("dropout_rate", "dropout"), ("attention_dropout_rate", "dropatt"),
          ("layer_norm_eps", "layer_norm_epsilon")),
    activation=(None, {None: "relu"}),  # no HF key: Transformer-XL's MLP is always ReLU
    fixed={**RELATIVE, "scale_embeddings": True}, imported={"pooler": False},
    defaults=dict(
        vocab_size=267735, cutoffs=[20000, 40000, 200000], d_model=1024, d_embed=1024, d_head=64, d_inner=4096,
        div_val=4, pre_lnorm=False, n_layer=18, n_head=16, mem_len=1600, same_length=True, attn_type=0,
        clamp_len=1000, sample_softmax=-1, dropout=0.1, dropatt=0.0, untie_r=True, layer_norm_epsilon=1e-5,
        tie_word_embeddings=True),
    tokenizer="TransfoXLTokenizer",
    # a full softmax tied to the token table: no adaptive clusters, no projections
    required={"cutoffs": [], "div_val": 1, "pre_lnorm": False, "attn_type": 0, "sample_softmax": -1,
              "tie_word_embeddings": True},
    translations=(Recurrent((("mem_len", "mem_len", 0), ("clamp_len", "clamp_len", -1),
                             ("same_length", "same_length", False), ("untie_r", "untie_r", True))),
                  hf_config.SameValue("d_embed", "d_model", "hidden_size")),
    tied={"crit.out_layers.0.weight": "transformer.word_emb.emb_layers.0.weight"},
)
XLNET = HFModel(
    "xlnet", "xlnet", {"model": "XLNetLMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "", "transformer", (names.XLNET_EMBEDDINGS, names.XLNET_LAYER), trunk=True),
            names.Part("model", "", "", (names.XLNET_HEAD,), trunk=False)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "d_model"), ("num_layers", "n_layer"), ("num_heads", "n_head"),
          ("intermediate_size", "d_inner"), ("dropout_rate", "dropout"), ("layer_norm_eps", "layer_norm_eps"),
          ("initializer_range", "initializer_range")),
    activation=("ff_activation", {**GELUS, "relu": "relu"}),
    fixed={**RELATIVE, "scale_embeddings": False}, imported={"pooler": False},
    defaults=dict(vocab_size=32000, d_model=1024, n_layer=24, n_head=16, d_head=64, ff_activation="gelu",
                  d_inner=4096, untie_r=True, attn_type="bi", initializer_range=0.02, layer_norm_eps=1e-12,
                  dropout=0.1, mem_len=512, reuse_len=None, bi_data=False, clamp_len=-1, same_length=False,
                  tie_word_embeddings=True),
    tokenizer="XLNetTokenizer", required={"attn_type": "bi", "tie_word_embeddings": True},
    written={"pad_token_id": 5, "bos_token_id": 1, "eos_token_id": 2},
    translations=(Recurrent((("mem_len", "mem_len", 0), ("reuse_len", "reuse_len", 0), ("clamp_len", "clamp_len", -1),
                             ("bi_data", "bi_data", False)), untied=True),
                  hf_config.OneDropout()),
    tied={"lm_loss.weight": "transformer.word_embedding.weight"},
)

@dataclasses.dataclass(frozen=True)
class MobileBertSettings:
    """MobileBERT's bottleneck keys (`families.mobilebert.model.Bottleneck`, HF's names) and its embedding
    width, which HF always states (the token table is E wide even when E = H)."""

    def from_hf(self, hf: hf_config.BySource, block: hf_config.Block, where: dict[str, str]) -> None:
        main = hf_config._main(hf)
        block.update({key: main[key] for key in mobilebert.EXTRA_KEYS}, embedding_size=main["embedding_size"])

    def to_hf(self, block: hf_config.Block, cfg: TransformerConfig, hf: hf_config.HFConfig, tokenizer: Any) -> None:
        hf.update(dataclasses.asdict(mobilebert.settings(block)), embedding_size=cfg.embed_dim)


MOBILEBERT = HFModel(
    "mobilebert", "mobilebert", {"model": "MobileBertForPreTraining"}, prefix="mobilebert",
    layout=(names.Part("model", "encoder", "mobilebert",
                       (names.MOBILEBERT_EMBEDDINGS, names.MOBILEBERT_LAYER, names.BERT_POOLER), trunk=True),
            names.Part("model", "", "", (names.MOBILEBERT_HEADS,), trunk=False)),
    # classifier_activation is our pooler (dense + tanh on the first token, or the token as is)
    keys=(*ENCODER_KEYS, ("pooler", "classifier_activation")), activation=("hidden_act", {"relu": "relu", **GELUS}),
    fixed={k: v for k, v in ENCODER.items() if k != "embedding_size"},
    defaults={**{k: v for k, v in BERT_DEFAULTS.items() if k != "position_embedding_type"}, "hidden_size": 512,
              "num_hidden_layers": 24, "num_attention_heads": 4, "intermediate_size": 512, "hidden_act": "relu",
              "hidden_dropout_prob": 0.0, "embedding_size": 128,
              "trigram_input": True, "use_bottleneck": True, "intra_bottleneck_size": 128,
              "use_bottleneck_attention": False, "key_query_shared_bottleneck": True, "num_feedforward_networks": 4,
              "normalization_type": "no_norm", "classifier_activation": True, "tie_word_embeddings": True},
    tokenizer="MobileBertTokenizer", required={"tie_word_embeddings": True}, written={"pad_token_id": 0},
    translations=(MobileBertSettings(),),
    tied={"cls.predictions.decoder.weight": "mobilebert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="mobilebert.pooler.dense.weight",
)

RECORDS = {r.model_type: r for r in (BERT, ROBERTA, ALBERT, ELECTRA, DISTILBERT, MOBILEBERT, GPT2, OPENAI_GPT, T5, MT5,
                                     BART, TRANSFO_XL, XLNET)}


def by_type(model_type: Any, where: str) -> HFModel:
    """The record of an HF config's model_type (`where` names the config in errors)."""
    if model_type not in RECORDS:
        raise UserError(f"{where}: model_type {model_type!r} is not importable; supported: {', '.join(RECORDS)}")
    return RECORDS[model_type]


def for_run(block: dict[str, Any]) -> HFModel:
    """The record an export of a run with model block `block` writes: the model type of its
    family whose fixed settings it has."""
    family = block["family"]
    candidates = [r for r in RECORDS.values() if r.family == family]
    if not candidates:
        families = sorted({r.family for r in RECORDS.values()})
        raise UserError(f"model family {family!r} has no Hugging Face counterpart; use one of {', '.join(families)}")
    cfg = models.encoder_config(block)
    mismatches = {r.model_type: r.mismatch(cfg) for r in candidates}
    for record in candidates:
        if mismatches[record.model_type] is None:
            return record
    needs = "; ".join(f"{t} needs {m}" for t, m in mismatches.items())
    raise UserError(f"no Hugging Face model type computes this {family} model: {needs}")


def with_extra_source(source: str) -> list[str]:
    """The model types whose runs have a checkpoint `source` besides the main one."""
    return [r.model_type for r in RECORDS.values() if source in r.sources[1:]]


# Megatron-BERT: BERT's config keys, names and heads, with pre-LN layers, a final norm and no
# embedding norm (`families.megatron_bert.model`); HF's defaults are megatron-bert-cased-345m's shape.
MEGATRON_BERT = HFModel(
    "megatron-bert", "megatron_bert", {"model": "MegatronBertForPreTraining"}, prefix="bert",
    layout=(names.Part("model", "encoder", "bert", (names.EMBEDDINGS, names.MEGATRON_BERT_LAYER,
                                                    names.MEGATRON_BERT_FINAL_NORM, names.BERT_POOLER), trunk=True),
            names.Part("model", "", "", (names.BERT_HEADS,), trunk=False)),
    keys=ENCODER_KEYS, activation=("hidden_act", GELUS), fixed={**CORE, "norm": "pre", "embedding_norm": False},
    defaults={**BERT_DEFAULTS, "vocab_size": 29056, "hidden_size": 1024, "num_hidden_layers": 24,
              "num_attention_heads": 16, "intermediate_size": 4096},
    tokenizer="BertTokenizer", required=ABSOLUTE, written={"pad_token_id": 0},
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    pooler="bert.pooler.dense.weight",
)
RECORDS[MEGATRON_BERT.model_type] = MEGATRON_BERT
