"""BERT for pretraining: the shared encoder plus an MLM head and an NSP head."""

from bertology.families.bert.model import FAMILY

__all__ = ["FAMILY"]
