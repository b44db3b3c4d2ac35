"""The simplest pre-BERT baselines (Dai & Le 2015, "Semi-supervised sequence learning"): a forward"""

from bertology.families.lstm.model import FAMILY

__all__ = ["FAMILY"]
