"""UniLM (Dong et al. 2019): one shared BERT-shaped Transformer trained as a bidirectional,
left-to-right, right-to-left and sequence-to-sequence LM at once, by giving each row of a batch
its own self-attention mask and predicting masked tokens under it.

The network is RoBERTa's (BERT's encoder and MLM head, no NSP head) with six segment types; what
makes it UniLM is data: each row carries `mask_kind` (an index into `Mask.KINDS`) and, for
sequence-to-sequence rows, `prefix_length` (the source length), which the core's `Mask` lowers
per row. Segment ids follow unilm-v1's `--new_segment_ids` (`UNILM_SEGMENTS`, which `data.py` writes):
0/1 bidirectional, 2 left-to-right, 3 right-to-left, 4/5 source/target.

Because the parameter tree is BERT's (`encoder/...` with the pooler, `mlm/...`), a BERT run or a
converted Hugging Face BERT starts it: `from_bert` copies every tensor it has at the same path
and widens the two-row segment table to six rows as unilm-v1's `from_pretrained` does (rows
2, 3, 4 from row 0; row 5 from row 1). The same function starts BERT-as-encoder models
(`configs/bert2bert.py`): an encoder-decoder whose encoder has BERT's names. (The pretraining
loop's `init_checkpoint` adopts only a checkpoint of the config's own family; for a BERT
checkpoint it has to keep this config's model block and start from `from_bert(saved, fresh)`.)

`bertology.generation` decodes a target for a source the UniLM way (greedy, sampled or beam
search): the next token is the MLM prediction at a `[MASK]` appended after the tokens so far,
under the sequence-to-sequence mask, against the KV cache (`next_token`, `seq2seq_batch`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertology import objectives
from bertology.data import masking
from bertology.data.rows import ShuffledRows
from bertology.errors import UserError
from bertology.families.roberta import model as roberta
from bertology.models import Family, decoding, encoder_config, flops
from bertology.models.transformer import Mask

# unilm-v1 `--new_segment_ids` (run_seq2seq.py, type_vocab_size 6): each kind's (first, second)
# segment id, so the segment embedding also tells the network which LM a row is.
UNILM_SEGMENTS = {"bidirectional": (0, 1), "left_to_right": (2, 2), "right_to_left": (3, 3), "seq2seq": (4, 5)}

# unilm-v1 `from_pretrained`: the row of BERT's two-row segment table each UniLM row starts from.
SEGMENT_ROWS_FROM_BERT = (0, 1, 0, 0, 0, 1)
SEQ2SEQ = Mask.KINDS.index("seq2seq")


def _prime(model: Model, params: Any, ids: jax.Array, mask: jax.Array, max_new_tokens: int, start_id: int | None,
           mask_id: int | None, copies: int) -> tuple[Any, jax.Array, decoding.Feed]:
    """The prefill takes the whole left-padded `[CLS] source [SEP]` (bidirectional, so every
    source token must see the last one); then the cache index steps back one and the last source
    token is fed again with the first `[MASK]`, rewriting its keys unchanged."""
    assert mask_id is not None, "generation._inputs refuses a UniLM call without mask_id"
    rows, source = ids.shape
    positions, last = decoding.last_positions(mask, copies)
    blank = jnp.zeros((rows, source + max_new_tokens), jnp.int32)
    cache = model.init(jax.random.key(0), seq2seq_batch(blank, blank, blank, source, jnp.arange(blank.shape[1])),
                       method=Model.next_token)["cache"]
    prefill = seq2seq_batch(ids, mask, positions, source, jnp.arange(source))
    _, variables = model.apply({"params": params, "cache": cache}, prefill, method=Model.next_token, mutable=["cache"])
    pair = jnp.arange(2)

    def feed(token: jax.Array, step: jax.Array) -> dict[str, jax.Array]:
        fed = jnp.stack([token, jnp.full_like(token, mask_id)], axis=1)
        return seq2seq_batch(fed, jnp.ones_like(fed), last + step + pair, source, source - 1 + step + pair)

    cache = decoding.repeat_rows(decoding.rewind(variables["cache"]), copies, model.cfg.scan_layers)
    return cache, jnp.repeat(ids[:, -1], copies), feed


def _forward(model: Model, params: Any, cache: Any, piece: dict[str, jax.Array]) -> tuple[jax.Array, Any]:
    """The logits at the step's `[MASK]`, whose cache slot is then given back."""
    logits, variables = model.apply({"params": params, "cache": cache}, piece, method=Model.next_token,
                                    mutable=["cache"])
    return logits.astype(jnp.float32), decoding.rewind(variables["cache"])


# unilm-v1's decoder: the left-padded source `[CLS] source [SEP]` is the input and the target
# follows it in the same sequence under the sequence-to-sequence mask (the source bidirectional,
# the target causal). Each step feeds the previous token and a `[MASK]` after it and reads the
# next token from the MLM head at the `[MASK]`; the cache index then steps back by one, so the
# next step overwrites the `[MASK]`'s keys with the token chosen for it. Outputs end at `[SEP]`.
DECODING = decoding.Decoding(
    transduces=True, left_pad=True, takes_start=False, takes_mask=True, prime=_prime, forward=_forward,
    frame=lambda tokenizer, ids, length: [tokenizer.cls_id, *ids[: None if length is None else length - 2],
                                          tokenizer.sep_id],
    end_id=lambda tokenizer: tokenizer.sep_id, positions=lambda width, longest, new: longest + new)


class Model(roberta.Model):
    """`mlm_logits` [batch, max_predictions, vocab] at `masked_positions`, each row under its own
    mask kind; `next_token` is the incremental decoding step (`DECODING`)."""

    decoding = DECODING  # a class constant (no annotation), not a module field

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


# unilm-v1 run_seq2seq.py's fine-tuning (`--mask_prob 0.7`): the share of target tokens masked.
TARGET_MASK_PROB = 0.7


def finetune_rows(sources: list[np.ndarray], targets: list[np.ndarray], source_length: int, target_length: int,
                  tokenizer: Any) -> dict[str, np.ndarray]:
    """Sequence-to-sequence fine-tuning rows `[CLS] source [SEP] target [SEP]` (right-padded to
    source_length + target_length; the source cut to source_length - 2 tokens, the target to
    target_length - 1), with the segments, mask kind and prefix length of `seq2seq_batch`."""
    rows = len(sources)
    length = source_length + target_length
    ids = np.full((rows, length), tokenizer.pad_id, np.int32)
    prefix = np.zeros(rows, np.int32)
    for i, (s, t) in enumerate(zip(sources, targets)):
        a = [tokenizer.cls_id, *s[: source_length - 2], tokenizer.sep_id]
        b = [*t[: target_length - 1], tokenizer.sep_id]
        ids[i, : len(a) + len(b)] = a + b
        prefix[i] = len(a)
    mask = (np.arange(length)[None] < (ids != tokenizer.pad_id).sum(1)[:, None]).astype(np.int32)
    source, target = UNILM_SEGMENTS["seq2seq"]
    return {"input_ids": ids, "input_mask": mask,
            "segment_ids": np.where(np.arange(length)[None] < prefix[:, None], source, target).astype(np.int32) * mask,
            "mask_kind": np.full(rows, SEQ2SEQ, np.int32), "prefix_length": prefix}


def mask_targets(rows: dict[str, np.ndarray], rng: np.random.Generator, tokenizer: Any, *, max_predictions: int,
                 prob: float = TARGET_MASK_PROB) -> dict[str, np.ndarray]:
    """`rows` (of `finetune_rows`) with target tokens masked for the MLM loss, as unilm-v1 fine-tunes:
    per row min(max_predictions, max(1, round(prob · target tokens))) positions drawn uniformly
    among the target's tokens (its closing [SEP] included, so the model learns to stop), each
    replaced 80/10/10 by [MASK] / a random token / itself. The source is never masked."""
    ids, real = rows["input_ids"], rows["input_mask"] > 0
    slots = np.arange(ids.shape[1])[None]
    target = real & (slots >= rows["prefix_length"][:, None])
    count = np.minimum(max_predictions, np.maximum(1, np.round(prob * target.sum(1)))).astype(int)
    keys = np.where(target, rng.random(ids.shape), 2.0)  # non-target slots sort last
    order = np.argsort(keys, axis=1)[:, :max_predictions]
    weights = np.arange(max_predictions)[None] < count[:, None]
    positions = np.sort(np.where(weights, order, ids.shape[1]), axis=1)
    positions, weights = np.where(positions < ids.shape[1], positions, 0).astype(np.int32), positions < ids.shape[1]
    corrupted = masking.corrupt(ids, positions, weights, rng, vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
                                special=np.asarray(sorted(tokenizer.special_ids)), mask_prob=0.8, random_prob=0.1)
    return {**rows, **corrupted}



class TargetMasked:
    """UniLM's fine-tuning batches: `rows`' batches with their targets masked afresh each batch
    (`mask_targets`, `data.target_mask_prob` of the target tokens, unilm-v1's 0.7), drawn
    from (seed, batch position) so that a resumed run masks exactly as the first did."""

    def __init__(self, rows: ShuffledRows, tokenizer: Any, max_predictions: int, prob: float, seed: int):
        self.rows, self.tokenizer, self.max_predictions, self.prob, self.seed = rows, tokenizer, max_predictions, prob, seed

    def set_state(self, state: dict[str, Any]) -> None:
        self.rows.set_state(state)

    def get_state(self) -> dict[str, Any]:
        return self.rows.get_state()

    def __next__(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.rows.position])
        return mask_targets(next(self.rows), rng, self.tokenizer, max_predictions=self.max_predictions,
                                  prob=self.prob)


def seq2seq_training(config: Any, tokenizer: Any, examples: list[dict], source_length: int,
                     target_length: int) -> tuple[TargetMasked, Any, dict[str, np.ndarray]]:
    """UniLM's sequence-to-sequence fine-tuning (the family's `seq2seq_training`), as the paper
    fine-tunes it: `[CLS] source [SEP] target [SEP]` under the sequence-to-sequence mask, MLM on
    `data.target_mask_prob` (default 0.7) of the target tokens, at most
    `data.max_predictions_per_seq` (default the target length) per row: (batches, objective, example)."""
    encode = lambda side: [np.asarray(tokenizer.encode(e[side]), np.int32) for e in examples]  # noqa: E731
    arrays = finetune_rows(encode("source"), encode("target"), source_length, target_length, tokenizer)
    prob = config.data.get("target_mask_prob", TARGET_MASK_PROB)
    if not 0.0 < prob <= 1.0:
        raise UserError(f"data.target_mask_prob={prob} must be in (0, 1]; UniLM fine-tunes at 0.7")
    max_predictions = config.data.get("max_predictions_per_seq") or target_length
    rows = TargetMasked(ShuffledRows(arrays, config.batch_size, config.seed), tokenizer, max_predictions, prob,
                        config.seed)
    first = mask_targets({k: v[:1] for k, v in arrays.items()}, np.random.default_rng(0), tokenizer,
                         max_predictions=max_predictions)
    return rows, objectives.get("roberta"), {k: v[:1] for k, v in first.items()}


FAMILY = Family(Model, trunk, flops_per_token, init_from=init_from, seq2seq_training=seq2seq_training)

