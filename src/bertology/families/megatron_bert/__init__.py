"""Megatron-BERT (Shoeybi et al. 2019, "Megatron-LM"): BERT with the LayerNorm moved."""

from bertology.families.megatron_bert.model import FAMILY

__all__ = ["FAMILY"]
