"""Tiny BERT, RoBERTa, ALBERT, ELECTRA and SpanBERT at equal pretraining FLOPs on the embedded
corpus, each then fine-tuned on the embedded task (python -m bertology.sweep --config ...).

A budget of 1 is what `reference_steps` steps of tiny BERT cost at this batch and length; every
family gets the steps that buy the same FLOPs. Sized for a 2-core CPU in well under an hour.
"""

import ml_collections

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = ml_collections.ConfigDict()
    c.configs_dir = "configs"
    c.families = ("bert", "roberta", "albert", "electra", "spanbert")
    c.variants = ()
    c.reference = "bert"
    c.budgets = (0.5, 1.0)
    c.reference_steps = 300
    c.batch_size = 32
    c.max_seq_length = 64
    c.mesh_shape = (-1, 1)
    # overrides of finetune/embedded.py
    c.finetune = ml_collections.ConfigDict(dict(classification=dict(epochs=3, data=dict(max_seq_length=64))))
    return c
