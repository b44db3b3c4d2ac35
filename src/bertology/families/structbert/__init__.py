"""StructBERT for pretraining: BERT's encoder and MLM head, and a three-way sentence-structure head."""

from bertology.families.structbert.model import FAMILY

__all__ = ["FAMILY"]
