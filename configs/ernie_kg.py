"""ERNIE (Tsinghua; Zhang et al. 2019, "ERNIE: Enhanced Language Representation with Informative
Entities"): a T-Encoder, a K-Encoder fusing frozen TransE entity vectors into the tokens, and
MLM + NSP + the denoising entity auto-encoder (dEA).

    python -m bertology.pretrain --config configs/ernie_kg.py:tiny --workdir runs/ernie_kg_tiny

`data.kg` names the knowledge graph: a directory with entity2id.txt, entity2vec.vec (thunlp/ERNIE's
kg_embed layout) and mentions.txt (`bertology/families/ernie_kg/knowledge.py` documents the
formats), or "embedded" (the default): the standard library's modules, classes and functions with
"defined in" and "mentions" relations, and TransE vectors trained for them on first use, so the
tiny preset runs with no download. `model.kg` follows it: fine-tuning a run aligns the task text
with that graph, which must then be at the same path.

Presets:
- tiny: one T-Encoder and one K-Encoder layer of width 128, 100-wide entities (the CPU recipe);
- base: the paper's sizes (§4.2, §4.4): N = 6 T-Encoder and M = 6 K-Encoder layers, H = 768 with
  12 heads, entity width 100 with 4 heads (thunlp/ERNIE), 256-token rows with 40 predictions
  (its create_insts.py), batch 512 and lr 5e-5 (§4.4). The paper starts from Google's BERT-base;
  here a run starts from scratch.
"""

import ml_collections

from bertology import recipes
from bertology.models.presets import bert_preset

SIZES = {
    "tiny": dict(bert_preset("tiny"), num_layers=1, knowledge_layers=1),
    "base": dict(bert_preset("base"), num_layers=6, knowledge_layers=6),
}
# The presets get_config takes; tests run each through validation.
PRESETS = tuple(SIZES)


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    c = recipes.pretraining(SIZES[preset], family="ernie_kg", objective="ernie_kg",
                            paper=preset not in recipes.SMALL_PRESETS)
    c.model.update(entity_size=100, entity_heads=4)
    # kg: a directory of knowledge.py's files, or "embedded"; max_entities: distinct entities a row keeps
    # (its dEA candidates, with the null one); 5% of the aligned entities replaced, 15% masked (§4.3)
    c.data.update(objective="ernie_kg", kg="embedded", max_entities=16, entity_replace_prob=0.05,
                  entity_mask_prob=0.15)
    # the model block records the graph (fine-tuning aligns task text with it and sees only that block):
    # one reference, so --config.data.kg=... sets both (config.json then holds the value in each)
    c.model.kg = c.data.get_ref("kg")
    if preset == "base":
        c.data.update(max_seq_length=256, max_predictions_per_seq=40, max_entities=64)
        c.batch_size = 512
        c.optimizer.learning_rate = 5e-5
    return c
