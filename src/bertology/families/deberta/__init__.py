"""DeBERTa-v3 (He et al. 2023, arXiv 2111.09543): DeBERTa-v2's network (Hugging Face `deberta-v2`),
a post-LN encoder with disentangled relative attention and no absolute positions."""

from bertology.families.deberta.model import FAMILY

__all__ = ["FAMILY"]
