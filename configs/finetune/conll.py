"""Fine-tune on CoNLL-2003 English NER from its column files (train.txt, valid.txt, test.txt).

    python -m bertology.finetune --config configs/finetune/conll.py \
        --config.init_checkpoint=runs/tiny --config.data.dir=/data/conll2003 --workdir runs/ner

Token classification on the first sub-word of each word; scored as conlleval scores it (entity
micro F1 on the validation file). data.dir defaults to data/conll2003.
"""

from bertology.train.finetune import default_config

# The presets get_config takes; tests run each through validation.
PRESETS = (None,)


def get_config():
    c = default_config("conll2003")
    c.epochs = 4
    c.optimizer.learning_rate = 5e-5
    return c
