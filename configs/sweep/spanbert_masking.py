"""SpanBERT's comparison of masking schemes (Joshi et al. 2020, §5.1) in miniature: tiny
RoBERTa-style models (single-segment rows, dynamic masking, masked LM alone, so the masking is
the only difference) pretrained on the embedded corpus at equal steps with each scheme, fine-tuned
on the embedded task, three seeds each, medians reported
(python -m bertology.sweep --config configs/sweep/spanbert_masking.py --workdir runs/spanbert_masking).

- `roberta`: subword tokens, as Google's BERT masks them;
- `whole_word`: whole words;
- `named_entity`: whole named entities, the other words as units (`data.mask_unit=entity` with the
  shipped `entities` list; the paper found entities with spaCy's recogniser);
- `noun_phrase`: whole noun phrases likewise (the shipped `phrases` list; the paper used spaCy's
  constituency parser);
- `geometric_span`: SpanBERT's random spans (lengths in words ~ Geometric(0.2), at most 10).
Each masks 15% of the tokens. In the paper random spans did best on most tasks, and the
linguistically informed schemes (entities, noun phrases) were not better than random spans.
"""

import pathlib

from bertology.sweep import load_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)
SCHEMES = {"whole_word": {"mask_unit": "whole_word"},
           "named_entity": {"mask_unit": "entity", "lexicon": "entities"},
           "noun_phrase": {"mask_unit": "entity", "lexicon": "phrases"},
           "geometric_span": {"mask_unit": "span"}}


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("equal_flops.py"))  # its shapes, budget unit and fine-tuning
    c.families = ("roberta",)
    c.reference = "roberta"
    c.variants = tuple(dict(name=name, config="roberta.py:tiny", overrides={"data": data}) for name, data in SCHEMES.items())
    c.budgets = (1.0,)
    c.seeds = (0, 1, 2)
    return c
