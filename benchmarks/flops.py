"""Counted model FLOPs of one BERT pretraining step, for MFU.

Only matrix multiplies count (2 FLOPs per multiply-add); a training step is 3x the forward pass
(forward, and backward's two products per matmul). Embedding lookups, softmax, LayerNorm and GELU
are left out, as in the usual MFU accounting. What is counted is what runs: with `predictions`,
the MLM head and the last layer's queries, attention and feed-forward block run only at the
gathered positions (plus [CLS] for the pooler), its keys and values at every position.
"""

from __future__ import annotations

from bertology.models.transformer import TransformerConfig


def forward_flops_per_token(cfg: TransformerConfig, length: int, predictions: int | None) -> float:
    """Forward matmul FLOPs per input token. `predictions=None`: the MLM head and the whole last
    layer at every position, as a model without gathering (Hugging Face's) runs them."""
    h, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.embed_dim
    keys_values = 2 * 2 * h * h
    per_query = 2 * 2 * h * h + 2 * 2 * h * i + 2 * 2 * length * h  # q, out; MLP; scores and context
    last_share = 1.0 if predictions is None else (predictions + 1) / length
    trunk = cfg.num_layers * keys_values + (cfg.num_layers - 1 + last_share) * per_query
    trunk += 2 * e * h if cfg.embedding_size else 0
    head = 2 * h * e + 2 * e * cfg.vocab_size  # transform, then logits against the tied table
    head_share = 1.0 if predictions is None else predictions / length
    sentence = (2 * h * h + 2 * h * 2) / length  # pooler and the NSP classifier, once per sequence
    return trunk + head_share * head + sentence


def train_flops_per_token(cfg: TransformerConfig, length: int, predictions: int | None) -> float:
    return 3 * forward_flops_per_token(cfg, length, predictions)
