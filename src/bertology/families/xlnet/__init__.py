"""XLNet (Yang et al. 2019): permutation language modelling with two-stream relative attention."""

from bertology.families.xlnet.model import FAMILY

__all__ = ["FAMILY"]
