"""Projected attention layers (Stickland & Murray 2019, "BERT and PALs"): a small task-specific
attention beside every layer of a shared encoder.

A PAL for layer l reads the layer's input h (not its output) and computes

    TS(h) = V^D · MH(V^E · h)

V^E projects the hidden size d_m down to d_s (the paper: 204 for BERT-base's 768), MH is
multi-head self-attention in d_s dimensions without its output matrix (V^D does that job; the
paper: 12 heads), and V^D projects back up to d_m. The paper adds TS(h) in parallel with the BERT
layer, inside its LayerNorm; in the full BERT layer that is the last residual sum, as the authors'
released code (Bert-n-Pals, `BERTLayer.forward`) adds it:

    a = LN(h + SA(h)),    h' = LN(a + FFN(a) + TS(h)).

The core's per-layer branch (`Stack.run`'s `parallel`) is that sum. V^E and V^D are shared across
the layers (one pair per task: the paper's PALs) or, with `shared_projections=False`, one pair per
layer (the paper's other variants); the attention's query, key and value matrices are always the
layer's own. Everything is per task; the encoder under it is shared by every task and trained
with them.

Differences from the released code, on purpose: it applies a GELU after V^D, which the paper's
equation does not have, and uses 6 heads where the paper says 12 (`heads` sets it). Every matrix
starts from BERT's truncated normal (the released code's init of every linear layer), so a fresh
PAL already perturbs the pretrained network slightly; a PAL whose V^D is zero adds nothing.

Parameters per task (`parameters`): with shared projections 2·d_m·d_s + d_m + d_s (V^E, V^D and
their biases) plus L·3·(d_s² + d_s) (each layer's query, key and value); per layer, L times both.
BERT-base with d_s = 204 and shared projections: 1,819,836 per task, 1.7% of the encoder.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from bertology.models.attention import attend
from bertology.models.transformer import Dropout, HeadsDense, Mask, TransformerConfig, dense

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PALSettings:
    """One task's PALs: the projected width d_s, its attention heads, and whether V^E and V^D are
    shared across the layers."""

    size: int = 204
    heads: int = 12
    shared_projections: bool = True


def parameters(settings: PALSettings, hidden_size: int, num_layers: int) -> int:
    """The parameters of one task's PALs over `num_layers` layers of width `hidden_size`."""
    d, s = hidden_size, settings.size
    projections = 2 * d * s + d + s
    attention = 3 * (s * s + s)
    return (projections if settings.shared_projections else num_layers * projections) + num_layers * attention


class ProjectedAttention(nn.Module):
    """One task's PALs over every layer of an encoder of config `cfg`; called as the encoder's
    parallel branch: (layer, the layer's input, its mask, deterministic) -> TS(input)."""

    cfg: TransformerConfig
    settings: PALSettings

    @nn.compact
    def __call__(self, layer: int, x: Array, mask: Mask, deterministic: bool) -> Array:
        cfg, s = self.cfg, self.settings
        # the attention's shapes in d_s dimensions (what HeadsDense reads); run on xla, not rotated
        small = dataclasses.replace(cfg, hidden_size=s.size, num_heads=s.heads, head_size=None, positions="absolute",
                                    attention_backend="xla")
        own = "" if s.shared_projections else f"_{layer}"
        h = dense(cfg, s.size, ("embed", "mlp"), f"down{own}")(x)
        q, k, v = (HeadsDense(small, to_heads=True, name=f"{part}_{layer}")(h) for part in ("query", "key", "value"))
        allowed, is_causal = mask.lower()
        dropout = None
        if not (deterministic or cfg.attention_dropout_rate == 0.0):
            drop = Dropout(cfg.attention_dropout_rate)
            dropout = lambda probs: drop(probs.astype(q.dtype), deterministic=False)  # noqa: E731
        ctx = attend(q, k, v, allowed=allowed, is_causal=is_causal, dropout=dropout)
        return dense(cfg, cfg.hidden_size, ("mlp", "embed"), f"up{own}")(ctx.reshape(*ctx.shape[:-2], s.size))
