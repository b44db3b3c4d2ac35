"""RoBERTa's input-format ablation (Liu et al. 2019, §4.2 and Table 2) in miniature: tiny BERT
pretrained on the embedded corpus with each input format at equal FLOPs, fine-tuned on the
embedded task, three seeds each, medians reported
(python -m bertology.sweep --config configs/sweep/roberta_formats.py --workdir runs/roberta_formats).

- `bert`: SEGMENT-PAIR+NSP, BERT's pairs of multi-sentence segments;
- `sentence_pair`: SENTENCE-PAIR+NSP, one natural sentence per segment;
- `full_sentences`: FULL-SENTENCES, no NSP, whole sentences packed across documents;
- `doc_sentences`: DOC-SENTENCES, the same without crossing a document's end.
The paper's MNLI-m for the order to look for: 84.0, 82.9, 84.7, 84.7 (SST-2 92.9, 92.1, 92.5,
92.7). The paper raised the batch for the short rows of the sentence formats to keep the tokens
per batch; here every variant keeps the batch, so the short-row formats also see fewer tokens.
"""

import pathlib

from bertology.sweep import load_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("equal_flops.py"))  # its shapes, budget unit and fine-tuning
    c.families = ("bert",)
    no_nsp = {"objective": "roberta"}  # masked LM alone on BERT's network
    c.variants = (
        dict(name="sentence_pair", config="bert.py:tiny", overrides={"data": {"instances": "sentence_pairs"}}),
        dict(name="full_sentences", config="bert.py:tiny", overrides={**no_nsp, "data": {"instances": "full_sentences"}}),
        dict(name="doc_sentences", config="bert.py:tiny", overrides={**no_nsp, "data": {"instances": "doc_sentences"}}),
    )
    c.budgets = (1.0,)
    c.seeds = (0, 1, 2)
    return c
