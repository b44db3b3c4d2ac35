"""ERNIE (Tsinghua; Zhang et al. 2019): a text encoder and a knowledgeable encoder fusing TransE
entity vectors into the tokens, trained with MLM, NSP and the denoising entity auto-encoder."""

from bertology.families.ernie_kg.model import FAMILY

__all__ = ["FAMILY"]
