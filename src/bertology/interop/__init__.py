"""Checkpoint interop: Hugging Face checkpoints in and out of bertology run directories.

`records` holds the record of an HF model type (what differs between them) and finds each
family's records (`families/<name>/interop.py`); `names` holds the layout rules and the name
tables several families share, `hf_config` the config translation, `hf` the file work.
"""

from bertology.interop.hf import ImportReport, export_hf, import_hf

__all__ = ["ImportReport", "export_hf", "import_hf"]
