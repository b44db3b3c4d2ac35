"""Checkpoint interop: Hugging Face checkpoints in and out of bertology run directories.

`names` holds the per-family name maps, `hf_config` the config translation, `hf` the file work.
"""

from bertology.interop.hf import ImportReport, export_hf, import_hf

__all__ = ["ImportReport", "export_hf", "import_hf"]
