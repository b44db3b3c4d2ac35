"""Counted model FLOPs of one BERT pretraining step, for MFU.

Only matrix multiplies count (2 FLOPs per multiply-add); a training step is 3x the forward pass
(forward, and backward's two products per matmul). Embedding lookups, softmax, LayerNorm and GELU
are left out, as in the usual MFU accounting. The MLM head runs at the `predictions` gathered
positions only, so its cost per token is scaled by predictions / length.
"""

from __future__ import annotations

from bertology.models.encoder import EncoderConfig


def forward_flops_per_token(cfg: EncoderConfig, length: int, predictions: int | None) -> float:
    """Forward matmul FLOPs per input token. `predictions=None`: the MLM head at every position."""
    h, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.embed_dim
    per_layer = 2 * 4 * h * h + 2 * 2 * h * i + 2 * 2 * length * h  # q,k,v,out; MLP; scores and context
    trunk = cfg.num_layers * per_layer + (2 * e * h if cfg.embedding_size else 0)
    head = 2 * h * e + 2 * e * cfg.vocab_size  # transform, then logits against the tied table
    head_share = 1.0 if predictions is None else predictions / length
    sentence = (2 * h * h + 2 * h * 2) / length  # pooler and the NSP classifier, once per sequence
    return trunk + head_share * head + sentence


def train_flops_per_token(cfg: EncoderConfig, length: int, predictions: int | None) -> float:
    return 3 * forward_flops_per_token(cfg, length, predictions)
