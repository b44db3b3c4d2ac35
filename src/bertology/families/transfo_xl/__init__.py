"""Transformer-XL (Dai et al. 2019): a causal LM with relative attention and segment recurrence."""

from bertology.families.transfo_xl.model import FAMILY

__all__ = ["FAMILY"]
