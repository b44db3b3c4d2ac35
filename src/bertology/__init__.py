"""bertology: the BERT family in JAX/Flax."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bertology")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # sources on sys.path that pip never installed
    __version__ = "0+unknown"
