"""T5 (Raffel et al. 2020), T5 v1.1 and mT5 (Xue et al. 2021): a pre-LN encoder-decoder with"""

from bertology.families.t5.model import FAMILY

__all__ = ["FAMILY"]
