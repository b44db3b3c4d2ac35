"""BART (Lewis et al. 2020): a post-LN encoder-decoder denoiser with learned positions; also the"""

from bertology.families.bart.model import FAMILY

__all__ = ["FAMILY"]
