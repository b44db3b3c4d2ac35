"""TinyBERT (Jiao et al. 2020): a narrow, shallow BERT distilled layer by layer from a BERT teacher."""

from bertology.families.tinybert.model import FAMILY

__all__ = ["FAMILY"]
