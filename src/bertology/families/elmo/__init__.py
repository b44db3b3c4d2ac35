"""ELMo's biLM (Peters et al. 2018) as allenai/bilm-tf builds it: not a Transformer."""

from bertology.families.elmo.model import FAMILY

__all__ = ["FAMILY"]
