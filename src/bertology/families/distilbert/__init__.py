"""DistilBERT (Sanh et al. 2019): a BERT with half the layers, no segment table, no pooler, no"""

from bertology.families.distilbert.model import FAMILY

__all__ = ["FAMILY"]
