"""XLNet's Hugging Face record (`XLNetLMHeadModel`)."""

from __future__ import annotations

from bertology.interop import hf_config, names
from bertology.interop.records import GELUS, RELATIVE, HFModel

# XLNet: the attention's projections are bare [H, heads, head_dim] tensors, as ours.
XLNET_EMBEDDINGS = (
    ("embeddings/token", "word_embedding", "embedding"),
    ("mask_emb", "mask_emb", "tensor"),
)
XLNET_LAYER = (
    ("attention_{i}/query", "layer.{i}.rel_attn.q", "kernel_tensor"),
    ("attention_{i}/key", "layer.{i}.rel_attn.k", "kernel_tensor"),
    ("attention_{i}/value", "layer.{i}.rel_attn.v", "kernel_tensor"),
    ("attention_{i}/position", "layer.{i}.rel_attn.r", "kernel_tensor"),
    ("attention_{i}/output", "layer.{i}.rel_attn.o", "tensor"),
    ("attention_{i}/biases/r_w_bias", "layer.{i}.rel_attn.r_w_bias", "tensor"),
    ("attention_{i}/biases/r_r_bias", "layer.{i}.rel_attn.r_r_bias", "tensor"),
    ("attention_{i}/biases/r_s_bias", "layer.{i}.rel_attn.r_s_bias", "tensor"),
    ("attention_{i}/segment", "layer.{i}.rel_attn.seg_embed", "tensor"),
    ("attention_{i}/norm", "layer.{i}.rel_attn.layer_norm", "norm"),
    ("ffn_{i}/intermediate", "layer.{i}.ff.layer_1", "dense"),
    ("ffn_{i}/output", "layer.{i}.ff.layer_2", "dense"),
    ("ffn_{i}/norm", "layer.{i}.ff.layer_norm", "norm"),
)
XLNET_HEAD = (("lm_bias", "lm_loss.bias", "tensor"),)

XLNET = HFModel(
    "xlnet", "xlnet", {"model": "XLNetLMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "", "transformer", (XLNET_EMBEDDINGS, XLNET_LAYER), trunk=True),
            names.Part("model", "", "", (XLNET_HEAD,), trunk=False)),
    keys=(("vocab_size", "vocab_size"), ("hidden_size", "d_model"), ("num_layers", "n_layer"), ("num_heads", "n_head"),
          ("intermediate_size", "d_inner"), ("dropout_rate", "dropout"), ("layer_norm_eps", "layer_norm_eps"),
          ("initializer_range", "initializer_range")),
    activation=("ff_activation", {**GELUS, "relu": "relu"}),
    fixed={**RELATIVE, "scale_embeddings": False}, imported={"pooler": False},
    defaults=dict(vocab_size=32000, d_model=1024, n_layer=24, n_head=16, d_head=64, ff_activation="gelu",
                  d_inner=4096, attn_type="bi", initializer_range=0.02, layer_norm_eps=1e-12,
                  dropout=0.1, mem_len=512, reuse_len=None, bi_data=False, clamp_len=-1, same_length=False,
                  tie_word_embeddings=True),
    tokenizer="XLNetTokenizer", required={"attn_type": "bi", "tie_word_embeddings": True},
    written={"pad_token_id": 5, "bos_token_id": 1, "eos_token_id": 2},
    translations=(hf_config.Recurrent((("mem_len", "mem_len", 0), ("reuse_len", "reuse_len", 0),
                                       ("clamp_len", "clamp_len", -1), ("bi_data", "bi_data", False)), untied=True),
                  hf_config.OneDropout()),
    tied={"lm_loss.weight": "transformer.word_embedding.weight"},
    generates=True,
)

HF_RECORDS = (XLNET,)
