"""UniLM (Dong et al. 2019): one shared BERT-shaped Transformer trained as a bidirectional,
left-to-right, right-to-left and sequence-to-sequence LM at once, by giving each row of a batch
its own self-attention mask and predicting masked tokens under it.

The network is RoBERTa's (BERT's encoder and MLM head, no NSP head) with six segment types; what
makes it UniLM is data: each row carries `mask_kind` (an index into `Mask.KINDS`) and, for
sequence-to-sequence rows, `prefix_length` (the source length), which the core's `Mask` lowers
per row. Segment ids follow unilm-v1's `--new_segment_ids` (`data.transforms.UNILM_SEGMENTS`):
0/1 bidirectional, 2 left-to-right, 3 right-to-left, 4/5 source/target.

Because the parameter tree is BERT's (`encoder/...` with the pooler, `mlm/...`), a BERT run or a
converted Hugging Face BERT starts it: `from_bert` copies every tensor it has at the same path
and widens the two-row segment table to six rows as unilm-v1's `from_pretrained` does (rows
2, 3, 4 from row 0; row 5 from row 1). The same function starts BERT-as-encoder models
(`configs/bert2bert.py`): an encoder-decoder whose encoder has BERT's names. (The pretraining
loop's `init_checkpoint` adopts only a checkpoint of the config's own family; for a BERT
checkpoint it has to keep this config's model block and start from `from_bert(saved, fresh)`.)

`greedy_seq2seq` decodes a target for a source the UniLM way: the next token is the MLM
prediction at a `[MASK]` appended after the tokens so far, under the sequence-to-sequence mask.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertology.data.transforms import UNILM_SEGMENTS
from bertology.errors import UserError
from bertology.models import encoder_config, flops, roberta
from bertology.models.transformer import Mask

# unilm-v1 `from_pretrained`: the row of BERT's two-row segment table each UniLM row starts from.
SEGMENT_ROWS_FROM_BERT = (0, 1, 0, 0, 0, 1)
SEQ2SEQ = Mask.KINDS.index("seq2seq")


class Model(roberta.Model):
    """`mlm_logits` [batch, max_predictions, vocab] at `masked_positions`, each row under its own
    mask kind; `next_token` is the incremental decoding step (see `greedy_seq2seq`)."""

    def next_token(self, batch: dict[str, jax.Array]) -> jax.Array:
        """Logits [batch, vocab] at the last of the new tokens, against the KV cache (flax
        collection `cache`, made by calling this method on a full-length batch in `init`)."""
        states = self.encoder.run(batch, True, decode=True)[-1]
        return self.mlm(states[:, -1:], self.encoder.attend)[:, 0]


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """BERT's masked-LM count: the mask kinds change which scores are kept, not how many run."""
    return flops.masked_lm(encoder_config(config.model), config.data.max_seq_length,
                           config.data.max_predictions_per_seq, nominal)


def from_bert(bert: dict, fresh: dict) -> dict:
    """`fresh` parameters with every tensor that the BERT-family parameters `bert` have at the
    same path replaced by BERT's: the whole trunk (`encoder/...`) and the MLM head where both
    have them; BERT's extra tensors (NSP head; the pooler when `fresh` has none) are dropped,
    and what BERT lacks (a decoder) stays fresh. A wider segment table is filled per
    `SEGMENT_ROWS_FROM_BERT`. Any other shape difference is a UserError."""
    if "encoder" not in bert:
        raise UserError("the init checkpoint has no `encoder` parameters; start UniLM or bert2bert from a BERT-family "
                        "run or a converted Hugging Face BERT")
    saved = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(bert)}

    def take(path: tuple, leaf: Any) -> Any:
        name = jax.tree_util.keystr(path)
        if name not in saved:
            return leaf
        value = saved[name]
        if value.shape == leaf.shape:
            return jnp.asarray(value, leaf.dtype)
        if name.endswith("['embeddings']['segment']['embedding']") and value.shape[1:] == leaf.shape[1:] \
                and value.shape[0] == 2 and leaf.shape[0] <= len(SEGMENT_ROWS_FROM_BERT):
            return jnp.asarray(value[list(SEGMENT_ROWS_FROM_BERT[: leaf.shape[0]])], leaf.dtype)
        raise UserError(f"init checkpoint tensor {name} has shape {value.shape} but this config builds {leaf.shape}; "
                        "use the BERT checkpoint's sizes (layers, hidden, heads, vocab, positions)")

    return jax.tree_util.tree_map_with_path(take, fresh)



def init_from(params: dict, fresh: dict) -> dict:
    """Family contract: start a UniLM run from another family's checkpoint (BERT's)."""
    return from_bert(params, fresh)


def seq2seq_batch(ids: jax.Array, mask: jax.Array, positions: jax.Array, source_length: int,
                  slots: jax.Array) -> dict[str, jax.Array]:
    """A UniLM sequence-to-sequence batch: source segment before `source_length` slots, target
    segment from there (`slots`: the sequence slots of `ids`)."""
    source, target = UNILM_SEGMENTS["seq2seq"]
    rows = ids.shape[0]
    return {"input_ids": ids, "input_mask": mask, "positions": positions,
            "segment_ids": jnp.where(slots < source_length, source, target).astype(jnp.int32),
            "mask_kind": jnp.full((rows,), SEQ2SEQ, jnp.int32),
            "prefix_length": jnp.full((rows,), source_length, jnp.int32)}


def greedy_seq2seq(model: Model, params: Any, input_ids: np.ndarray, input_mask: np.ndarray, *, max_length: int,
                   mask_id: int, eos_id: int, pad_id: int = 0) -> np.ndarray:
    """Greedy targets [batch, max_length] for left-padded sources ([batch, S]: `[CLS] source
    [SEP]` ending at the last slot, `input_mask` 0 on the padding), with the KV cache.

    Step t feeds the previous target token and a `[MASK]` at the next slot (positions continue
    each row's own count, `cumsum(mask) - 1`), reads the MLM prediction at the `[MASK]`, and
    then rewinds the cache index by one so the next step overwrites the `[MASK]` with the token
    chosen for it: the cache only ever holds source and real target tokens, as unilm-v1's
    decoder keeps. Tokens after a row's `eos_id` are `pad_id`.
    """
    rows, source_length = input_ids.shape
    total = source_length + max_length
    positions = np.maximum(np.cumsum(input_mask, axis=1) - 1, 0).astype(np.int32)
    ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.asarray(input_mask, jnp.int32)
    next_position = jnp.asarray(input_mask.sum(axis=1), jnp.int32)[:, None]  # the first target's position
    blank = jnp.zeros((rows, total), jnp.int32)
    cache = model.init(jax.random.key(0), seq2seq_batch(blank, blank, blank, source_length, jnp.arange(total)),
                       method=Model.next_token)["cache"]
    rewind: Callable[[Any], Any] = lambda c: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda p, x: x - 1 if jax.tree_util.keystr(p).endswith("['index']") else x, c)

    @jax.jit
    def step(cache: Any, ids: jax.Array, mask: jax.Array, positions: jax.Array,
             slots: jax.Array) -> tuple[jax.Array, Any]:
        batch = seq2seq_batch(ids, mask, positions, source_length, slots)
        logits, variables = model.apply({"params": params, "cache": cache}, batch, method=Model.next_token,
                                        mutable=["cache"])
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), rewind(variables["cache"])

    masks = jnp.full((rows, 1), mask_id, jnp.int32)
    ones = jnp.ones((rows, 1), jnp.int32)
    token, cache = step(cache, jnp.concatenate([ids, masks], 1), jnp.concatenate([mask, ones], 1),
                        jnp.concatenate([jnp.asarray(positions), next_position], 1), jnp.arange(source_length + 1))
    out = [token]
    for t in range(1, max_length):
        fed = jnp.concatenate([token[:, None], masks], 1)
        slots = source_length + t - 1 + jnp.arange(2)
        token, cache = step(cache, fed, jnp.ones((rows, 2), jnp.int32), next_position + t - 1 + jnp.arange(2), slots)
        out.append(token)
    return after_eos(np.asarray(jnp.stack(out, 1)), eos_id, pad_id)


def after_eos(tokens: np.ndarray, eos_id: int, pad_id: int) -> np.ndarray:
    """`tokens` with everything after each row's first `eos_id` set to `pad_id`."""
    seen = np.cumsum(tokens == eos_id, axis=1)
    ended = (seen - (tokens == eos_id)) > 0
    return np.where(ended, pad_id, tokens)
