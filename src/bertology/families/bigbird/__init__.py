"""BigBird (Zaheer et al. 2020): BERT's encoder with block-sparse attention (global, window, random blocks)."""

from bertology.families.bigbird.model import FAMILY

__all__ = ["FAMILY"]
