"""CoVe: the encoder of an attentional LSTM translation model, read as contextual word features."""

from bertology.families.cove.model import FAMILY

__all__ = ["FAMILY"]
