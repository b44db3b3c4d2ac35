"""Transformer-XL's Hugging Face record (`TransfoXLLMHeadModel`, HF's deprecated TransfoXL with
one full softmax).
"""

from __future__ import annotations

from bertology.interop import hf_config, names
from bertology.interop.records import RELATIVE, HFModel

# Transformer-XL (HF's deprecated TransfoXL with cutoffs=[], div_val=1): the attention's query,
# key and value are one bias-free Linear `qkv_net`; `o_net` keeps our [H, heads, head_dim] flat.
TRANSFO_XL_EMBEDDINGS = (("embeddings/token", "word_emb.emb_layers.0", "embedding"),)
TRANSFO_XL_SHARED_BIASES = (  # untie_r=False: one pair for every layer
    ("biases/r_w_bias", "r_w_bias", "tensor"),
    ("biases/r_r_bias", "r_r_bias", "tensor"),
)
TRANSFO_XL_LAYER = (
    ("attention_{i}/query", "layers.{i}.dec_attn.qkv_net", "to_heads", (0, 3)),
    ("attention_{i}/key", "layers.{i}.dec_attn.qkv_net", "to_heads", (1, 3)),
    ("attention_{i}/value", "layers.{i}.dec_attn.qkv_net", "to_heads", (2, 3)),
    ("attention_{i}/position", "layers.{i}.dec_attn.r_net", "to_heads"),
    ("attention_{i}/output", "layers.{i}.dec_attn.o_net", "heads_to_linear"),
    ("attention_{i}/biases/r_w_bias", "layers.{i}.dec_attn.r_w_bias", "tensor"),
    ("attention_{i}/biases/r_r_bias", "layers.{i}.dec_attn.r_r_bias", "tensor"),
    ("attention_{i}/norm", "layers.{i}.dec_attn.layer_norm", "norm"),
    ("ffn_{i}/intermediate", "layers.{i}.pos_ff.CoreNet.0", "dense"),
    ("ffn_{i}/output", "layers.{i}.pos_ff.CoreNet.3", "dense"),
    ("ffn_{i}/norm", "layers.{i}.pos_ff.layer_norm", "norm"),
)
TRANSFO_XL_HEAD = (("output_bias", "crit.out_layers.0.bias", "tensor"),)

TRANSFO_XL = HFModel(
    "transfo-xl", "transfo_xl", {"model": "TransfoXLLMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "", "transformer", (TRANSFO_XL_EMBEDDINGS, TRANSFO_XL_SHARED_BIASES,
                                                    TRANSFO_XL_LAYER), trunk=True),
            names.Part("model", "", "", (TRANSFO_XL_HEAD,), trunk=True)),
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
    translations=(hf_config.Recurrent((("mem_len", "mem_len", 0), ("clamp_len", "clamp_len", -1),
                                       ("same_length", "same_length", False), ("untie_r", "untie_r", True))),
                  hf_config.SameValue("d_embed", "d_model", "hidden_size")),
    tied={"crit.out_layers.0.weight": "transformer.word_emb.emb_layers.0.weight"},
    generates=True,
)

HF_RECORDS = (TRANSFO_XL,)
