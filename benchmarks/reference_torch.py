"""Hugging Face PyTorch references for the accelerator benchmark, built from the config an export
of our run would write (same shapes, activation, dropout rates, norm eps), random-initialised,
nothing downloaded.

Each is trained the way a PyTorch user of that model would: `attn_implementation="sdpa"` (PyTorch's
fused attention; eager where the model has no SDPA path, and the row says so), bf16 autocast over
float32 weights, the library's own loss where it has one, and `torch.optim.AdamW` (fused on GPU)
with our recipe's learning rate, betas, epsilon, weight decay and gradient clipping. BERT's loss
reads the MLM logits at the masked positions and adds NSP, as ours does; the library computes
the head at every position, which is part of what users of it pay.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from bertology import models
from bertology.interop import hf_config, records


def _hf_config(block: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The HF config.json an export of a run with this `model` block writes."""
    record = records.registry()[model_type]
    ((source, cfg),) = record.configs(block).items()
    return hf_config.to_hf(record, block, source, cfg, tokenizer=None)


def _model(kind: str, block: dict[str, Any]) -> tuple[Any, str]:
    """(the transformers model for `kind` (bert, gpt2, t5), the attention implementation it runs)."""
    import transformers

    if kind == "bert":
        cfg = models.encoder_config(block)
        config: Any = transformers.BertConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act="gelu",
            hidden_dropout_prob=cfg.dropout_rate, attention_probs_dropout_prob=cfg.attention_dropout_rate,
            max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
            layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range)
        model_class = transformers.BertForPreTraining
    else:
        config_class, model_class = {"gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
                                     "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration)}[kind]
        config = config_class.from_dict(_hf_config(block, kind))
    for implementation in ("sdpa", "eager"):
        try:
            return model_class._from_config(config, attn_implementation=implementation), implementation
        except (ValueError, ImportError):  # the model has no SDPA path in this transformers
            continue
    raise RuntimeError(f"transformers builds no {kind} model")


def _loss(kind: str, model: Any, batch: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F

    if kind == "bert":
        out = model(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                    token_type_ids=batch["segment_ids"])
        positions = batch["masked_positions"].long()
        logits = torch.gather(out.prediction_logits, 1,
                              positions[..., None].expand(-1, -1, out.prediction_logits.shape[-1]))
        weights = batch["masked_weights"]
        mlm = F.cross_entropy(logits.float().flatten(0, 1), batch["masked_ids"].long().flatten(), reduction="none")
        mlm = (mlm * weights.flatten()).sum() / weights.sum().clamp(min=1e-5)
        return mlm + F.cross_entropy(out.seq_relationship_logits.float(), batch["next_sentence_label"].long())
    if kind == "gpt2":
        return model(input_ids=batch["input_ids"], attention_mask=batch["input_mask"], labels=batch["input_ids"]).loss
    labels = batch["targets"].long().masked_fill(batch["target_weights"] == 0, -100)
    return model(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                 decoder_input_ids=batch["decoder_input_ids"], decoder_attention_mask=batch["decoder_input_mask"],
                 labels=labels).loss


def train_step(kind: str, block: dict[str, Any], optimizer: Any, batch: dict[str, np.ndarray],
               bf16: bool) -> tuple[Callable[[], None], str, Callable[[], float | None]]:
    """(one AdamW step of the reference on `batch`, returning once it is done unless called with
    wait=False; the attention implementation it runs; its peak device memory in bytes so far,
    None on CPU)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model, implementation = _model(kind, block)
    model.to(device).train()
    kwargs = {"fused": True} if device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=optimizer.learning_rate, betas=(optimizer.b1, optimizer.b2),
                            eps=optimizer.eps, weight_decay=optimizer.weight_decay, **kwargs)
    tensors = {k: torch.from_numpy(np.asarray(v, np.int64 if np.issubdtype(v.dtype, np.integer) else v.dtype)).to(device)
               for k, v in batch.items()}  # int64 ids: what torch's embeddings and losses take
    autocast = (torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step(wait: bool = True) -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = _loss(kind, model, tensors)
        loss.backward()
        if optimizer.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), optimizer.clip_norm)
        opt.step()
        if wait and device == "cuda":
            torch.cuda.synchronize()

    def peak() -> float | None:
        return float(torch.cuda.max_memory_allocated()) if device == "cuda" else None

    return step, implementation, peak
