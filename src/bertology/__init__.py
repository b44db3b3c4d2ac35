"""bertology: the BERT family in JAX/Flax."""

__version__ = "0.1.0"
