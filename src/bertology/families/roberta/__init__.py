"""RoBERTa for pretraining: the shared encoder and an MLM head; no next-sentence head."""

from bertology.families.roberta.model import FAMILY

__all__ = ["FAMILY"]
