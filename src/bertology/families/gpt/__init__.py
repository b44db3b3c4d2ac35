"""GPT (Radford et al. 2018) and GPT-2 (Radford et al. 2019): a causal Transformer decoder whose"""

from bertology.families.gpt.model import FAMILY

__all__ = ["FAMILY"]
