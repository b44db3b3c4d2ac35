"""MobileBERT (Sun et al. 2020): a deep, thin BERT whose blocks run inside a bottleneck."""

from bertology.families.mobilebert.model import FAMILY

__all__ = ["FAMILY"]
