"""UniLM (Dong et al. 2019): one shared BERT-shaped Transformer trained as a bidirectional,"""

from bertology.families.unilm.model import FAMILY

__all__ = ["FAMILY"]
