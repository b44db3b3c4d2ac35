"""Checkpoint interop: Hugging Face checkpoints in and out of bertology run directories.

`records` holds the record of an HF model type (what differs between them) and finds each
family's records (`families/<name>/interop.py`); `names` holds the layout rules and the name
tables several families share, `hf_config` the config translation, `hf` the file work, `card`
the model card and generation config an export writes, `sentence` the sentence-transformers export.
"""

from bertology.interop.hf import ImportReport, export_hf, import_hf
from bertology.interop.sentence import export_sentence_transformers

__all__ = ["ImportReport", "export_hf", "export_sentence_transformers", "import_hf"]
