"""The seq2seq fine-tune table: tiny BART, T5, MASS and UniLM pretrained at equal FLOPs on the
embedded corpus, plus the BERT-as-encoder route, each fine-tuned on the embedded seq2seq task
(docstring body -> first sentence) and scored by teacher-forced perplexity and ROUGE-1/2/L,
against BART from scratch (~65 min here; the README has the measured table).

    python -m bertology.sweep --config configs/sweep/seq2seq_finetune.py --workdir runs/s2s_finetune

`bert2bert` (configs/bert2bert.py) spends half its budget pretraining tiny BERT and the other half
on MASS's objective with BERT as the encoder and a fresh decoder, so its pretraining FLOPs match
the others'. A budget of 1 is `reference_steps` steps of tiny BART at this batch and length.
Each family keeps its own vocabulary (BART, MASS: byte-level BPE; T5: unigram + 100 sentinels;
UniLM, bert2bert: WordPiece), so ROUGE is computed on detokenized text.
"""

import ml_collections

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = ml_collections.ConfigDict()
    c.configs_dir = "configs"
    c.families = ("bart", "t5", "mass", "unilm")
    c.variants = (dict(name="bert2bert", config="bert2bert.py:tiny", init_from="bert.py:tiny"),)
    c.reference = "bart"
    c.budgets = (1.0,)
    c.reference_steps = 300
    c.batch_size = 32
    c.max_seq_length = 64
    c.mesh_shape = (-1, 1)
    c.scratch = "bart"
    # overrides of finetune/seq2seq.py:embedded_<family>
    c.finetune = ml_collections.ConfigDict(dict(seq2seq=dict(
        total_steps=200, batch_size=32, eval_examples=100,
        data=dict(max_seq_length=64, max_target_length=24), generation=dict(max_new_tokens=24))))
    return c
