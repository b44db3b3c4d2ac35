"""Model sizes by name, per family (BERT paper and Turc et al. 2019; ALBERT; ELECTRA)."""

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

# name: (num_layers, hidden_size, num_heads, intermediate_size, embedding_size E).
ALBERT_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (2, 128, 2, 512, 64),
    "base": (12, 768, 12, 3072, 128),
    "large": (24, 1024, 16, 4096, 128),
    "xlarge": (24, 2048, 16, 8192, 128),
    "xxlarge": (12, 4096, 64, 16384, 128),
}

# The discriminator's sizes; E = None means no factorization (E = H).
ELECTRA_SIZES: dict[str, tuple[int, int, int, int, int | None]] = {
    "tiny": (2, 128, 2, 512, 64),
    "small": (12, 256, 4, 1024, 128),
    "base": (12, 768, 12, 3072, None),
    "large": (24, 1024, 16, 4096, None),
}


def _lookup(table: dict, name: str):
    if name not in table:
        raise UserError(f"unknown preset {name!r}; known presets: {', '.join(table)}")
    return table[name]


def bert_preset(name: str) -> dict[str, int]:
    """TransformerConfig fields for a BERT preset; unknown names fail with the list of known ones."""
    layers, hidden, heads = _lookup(BERT_SIZES, name)
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden)


def factorized_preset(table: dict, name: str) -> dict[str, int | None]:
    """TransformerConfig fields for an ALBERT or ELECTRA preset (tables above)."""
    layers, hidden, heads, ff, embedding = _lookup(table, name)
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=ff,
                embedding_size=embedding)
