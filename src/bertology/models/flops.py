"""The one FLOP counter: training FLOPs per input token, from a model's shapes.

Only matrix multiplies count (2 FLOPs per multiply-add), and a training step is 3x the forward
pass (forward, and backward's two products per matmul), as in the usual MFU accounting
(Kaplan et al. 2020; embeddings, softmax, norms and activations left out). Family modules
compose these pieces in their `flops_per_token(config, nominal)`:
- what runs (`nominal=False`, for MFU): the last layer's queries, attention and feed-forward
  block only at the rows the heads read, the MLM head at the gathered predictions, the
  embedding projection, pooler and sentence classifier;
- `nominal=True`: the estimate the equal-FLOP sweep budgets with (ELECTRA paper style):
  6·(12·L·d² + 2·L·s·d) for a stack run at every position plus its heads, nothing else.
"""

from __future__ import annotations

from bertology.models.transformer import TransformerConfig

TRAIN = 3  # forward + backward (two products per matmul)


def stack(cfg: TransformerConfig, length: int, rows: int | None = None, nominal: bool = False) -> float:
    """Forward FLOPs per input token of a stack of `cfg.num_layers` layers over `length` tokens;
    `rows`: how many query rows the last layer runs (None: all)."""
    h, i, a = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim  # a: attention width
    mlp = 2 * h * i * (2 if cfg.gated else 1) + 2 * i * h
    keys_values = 2 * 2 * h * a
    per_query = 2 * 2 * h * a + mlp + 2 * 2 * length * a  # query and output; MLP; scores and context
    last = 1.0 if rows is None or nominal else rows / length
    flops = cfg.num_layers * keys_values + (cfg.num_layers - 1 + last) * per_query
    if cfg.embedding_size and not nominal:
        flops += 2 * cfg.embedding_size * h
    return flops


def lm_head(cfg: TransformerConfig, transform: bool = True) -> float:
    """Forward FLOPs per predicted token of a tied output layer (after an H->E transform, MLM)."""
    e = cfg.embed_dim
    return (2 * cfg.hidden_size * e if transform else 0) + 2 * e * cfg.vocab_size


def sentence_head(cfg: TransformerConfig, classes: int = 2) -> float:
    """Forward FLOPs per sequence of the pooler and a classifier on the first token (NSP, SOP)."""
    h = cfg.hidden_size
    return 2 * h * h + 2 * h * classes


def masked_lm(cfg: TransformerConfig, length: int, predictions: int, nominal: bool, rows: int | None = None,
              sentence: bool = False, boundary: bool = False) -> float:
    """Training FLOPs per input token of an MLM family: the encoder with its last layer at the
    predictions (+ [CLS]), the MLM head there, optionally NSP/SOP and SpanBERT's boundary head
    (two H-wide layers on [left; right; position] then the tied output). Nominal counts the
    encoder and the MLM head only. `rows`: the last layer's query rows (default predictions + 1)."""
    flops = (stack(cfg, length, rows=predictions + 1 if rows is None else rows, nominal=nominal)
             + lm_head(cfg) * predictions / length)
    if not nominal:
        h = cfg.hidden_size
        if sentence:
            flops += sentence_head(cfg) / length
        if boundary:
            flops += (2 * 3 * h * h + 2 * h * cfg.embed_dim + lm_head(cfg, transform=False)) * predictions / length
    return TRAIN * flops


def encoder_decoder(cfg: TransformerConfig, source_length: int, target_length: int) -> float:
    """Training FLOPs per source token of an encoder-decoder trained with teacher forcing: the
    encoder (`cfg.num_layers`) over the source, the decoder's self-attention stack
    (`cfg.decoder_layers`) over the target, each decoder layer's cross-attention (keys and values
    over the source, queries and output over the target), and the output layer at every target
    position. Everything runs at every position, so the nominal count is the same."""
    a = cfg.num_heads * cfg.head_dim
    decoder = cfg.decoder_config()
    cross_keys_values = 2 * 2 * cfg.hidden_size * a  # per source token and decoder layer
    cross_queries = 2 * 2 * cfg.hidden_size * a + 2 * 2 * source_length * a  # query, output; scores, context
    per_example = (source_length * (stack(cfg, source_length) + decoder.num_layers * cross_keys_values)
                   + target_length * (stack(decoder, target_length) + decoder.num_layers * cross_queries
                                      + lm_head(cfg, transform=False)))
    return TRAIN * per_example / source_length


def relative_stack(cfg: TransformerConfig, length: int, memory: int, segment_term: bool = False,
                   last_queries: bool = True) -> float:
    """Forward FLOPs per input token of a relative-attention stack (Transformer-XL, XLNet's content
    stream) over `length` tokens with `memory` slots per layer: keys and values over memory and
    segment, the position projection of the klen + length relative encodings, and per query its
    projection and output, the content scores (klen), the position scores before the shift
    (klen + length), the context (klen), XLNet's segment term (2 per head width) and the MLP.
    `last_queries=False`: nothing reads the last layer's content output (XLNet pretraining reads
    the query stream, and the memory holds layer inputs), so its queries and MLP never run."""
    h, i, a = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim
    klen = memory + length
    mlp = 2 * h * i + 2 * i * h
    per_segment = 2 * 2 * h * a * klen + 2 * h * a * (klen + length)
    per_query = 2 * 2 * h * a + mlp + 2 * a * (3 * klen + length) + (2 * 2 * a if segment_term else 0)
    return cfg.num_layers * per_segment / length + (cfg.num_layers - (not last_queries)) * per_query


def query_stream(cfg: TransformerConfig, length: int, memory: int, predictions: int) -> float:
    """Forward FLOPs per input token that XLNet's query stream adds: its projection, output and MLP
    at the `predictions` rows, placing them at their positions and back (two one-hot products),
    and scores and context at every position (the stream attends in the segment's layout)."""
    h, i, a = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim
    klen = memory + length
    per_prediction = 2 * 2 * h * a + 2 * h * i + 2 * i * h + 2 * 2 * length * a
    per_position = 2 * a * (3 * klen + length) + 2 * 2 * a
    return cfg.num_layers * (per_prediction * predictions / length + per_position)
