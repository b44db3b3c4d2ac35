"""ALBERT for pretraining: a factorized, layer-sharing encoder with MLM and sentence-order heads."""

from bertology.families.albert.model import FAMILY

__all__ = ["FAMILY"]
