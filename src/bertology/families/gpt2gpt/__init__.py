"""GPT2GPT (Ramachandran, Liu & Le 2017, "Unsupervised Pretraining for Sequence to Sequence
Learning", Transformer version): an encoder-decoder whose encoder is one GPT run and whose decoder
another, fine-tuned with the two language-model losses as a regulariser."""

from bertology.families.gpt2gpt.model import FAMILY

__all__ = ["FAMILY"]
