"""context2vec: a word's sentential context as one vector, trained against the word's embedding."""

from bertology.families.context2vec.model import FAMILY

__all__ = ["FAMILY"]
