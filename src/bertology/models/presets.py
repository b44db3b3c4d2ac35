"""Model sizes by name (BERT paper; the small ones from Turc et al. 2019)."""

from __future__ import annotations

from bertology.errors import UserError

# name: (num_layers, hidden_size, num_heads); intermediate is 4·H throughout.
BERT_SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def bert_preset(name: str) -> dict[str, int]:
    """EncoderConfig fields for a BERT preset; unknown names fail with the list of known ones."""
    if name not in BERT_SIZES:
        raise UserError(f"unknown preset {name!r}; known presets: {', '.join(BERT_SIZES)}")
    layers, hidden, heads = BERT_SIZES[name]
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden)
