"""LSTM2LSTM (Ramachandran, Liu & Le 2017, "Unsupervised Pretraining for Sequence to Sequence
Learning", the paper's LSTM version): an attentional LSTM encoder-decoder whose lower layers are a
source-side and a target-side LSTM language model, fine-tuned with the two language-model losses
as a regulariser."""

from bertology.families.lstm2lstm.model import FAMILY

__all__ = ["FAMILY"]
