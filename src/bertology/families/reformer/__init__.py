"""Reformer (Kitaev et al. 2020): LSH and local chunked attention in reversible layers, axial positions."""

from bertology.families.reformer.model import FAMILY

__all__ = ["FAMILY"]
