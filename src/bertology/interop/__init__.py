"""Checkpoint interop: Hugging Face checkpoints in and out of bertology run directories.

`families` holds one record per HF model type (what differs between them), `names` the name
tables and layout rules, `hf_config` the config translation, `hf` the file work.
"""

from bertology.interop.hf import ImportReport, export_hf, import_hf

__all__ = ["ImportReport", "export_hf", "import_hf"]
