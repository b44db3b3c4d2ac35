"""SpanBERT for pretraining: the shared encoder, an MLM head and the span boundary head."""

from bertology.families.spanbert.model import FAMILY

__all__ = ["FAMILY"]
