"""StructBERT pretraining (Wang et al. 2020): BERT plus two structural objectives.

    python -m bertology.pretrain --config configs/structbert.py:tiny --workdir runs/structbert_tiny

The word structural objective shuffles 5% of the unmasked trigrams and predicts each shuffled
token's original through the MLM head (`data.shuffle_trigrams`); the sentence structural
objective tells whether segment B follows A, precedes it, or comes from another document (three
classes where BERT's NSP has two). The three losses are summed. BERT's network, masking and
recipe otherwise; the prediction slots hold the masked and the shuffled tokens, about 30% of a
row. Presets as BERT's (tiny ... large).
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import BERT_SIZES, bert_preset

# The presets get_config takes; tests run each through validation.
PRESETS = tuple(BERT_SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = recipes.pretraining(bert_preset(preset), family="structbert", objective="structbert",
                            paper=preset not in recipes.SMALL_PRESETS)
    # 15% masked and 5% of the trigrams (three tokens each) shuffled: room for about 30% of the row
    c.data.update(objective="structbert", shuffle_trigrams=0.05,
                  max_predictions_per_seq=int(0.3 * c.data.max_seq_length) + 1)
    return c
