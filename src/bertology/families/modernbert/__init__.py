"""ModernBERT (Warner et al. 2024): a pre-LN encoder with rotary positions, GeGLU and local/global attention."""

from bertology.families.modernbert.model import FAMILY

__all__ = ["FAMILY"]
