"""Quick-Thought pretraining (Logeswaran & Lee 2018): sentence vectors from picking a sentence's
neighbours out of the batch.

    python -m bertology.pretrain --config configs/quick_thought.py:tiny --workdir runs/qt_tiny
    python -m bertology.finetune --config configs/finetune/embedded.py --config.init_checkpoint=runs/qt_tiny ...

Two encoders (the core's, BERT's shapes): f reads a sentence, g its candidates; the loss is the
classifier over every other sentence of the batch whose targets are the sentences before and after
(rows of 8 consecutive sentences of a document, 8 rows a batch: 63 candidates each). The paper's
encoders were GRUs over word vectors; fine-tuning reads [f(s); g(s)] as the paper's downstream
features do. Its candidates are the batch's, so the batch is not split into microbatches
(grad_accum_steps stays 1). Presets as BERT's (tiny ... base).
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = ("tiny", "mini", "small", "base")


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = recipes.pretraining(bert_preset(preset), family="quick_thought", objective="quick_thought",
                            paper=preset not in recipes.SMALL_PRESETS)
    c.data.update(objective="quick_thought", max_seq_length=32, sentences_per_row=8)
    c.batch_size = 8 if preset in recipes.SMALL_PRESETS else 50  # rows: the paper's batch was 400 sentences
    return c
