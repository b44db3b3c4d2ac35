"""ELECTRA: a small MLM generator and a discriminator that share token and position embeddings."""

from bertology.families.electra.model import FAMILY

__all__ = ["FAMILY"]
