"""XLNet's pretraining loss: the permutation LM over the predicted targets, with carried memory.

It is Transformer-XL's loss (`objectives.transfo_xl`) read at the P targets that `target_mapping`
places: the same code, one way to compute it.
"""

from bertology.families.transfo_xl.objective import DERIVED, loss

__all__ = ["DERIVED", "loss"]
