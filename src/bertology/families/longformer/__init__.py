"""Longformer (Beltagy et al. 2020): RoBERTa with sliding-window and global attention, for long documents."""

from bertology.families.longformer.model import FAMILY

__all__ = ["FAMILY"]
