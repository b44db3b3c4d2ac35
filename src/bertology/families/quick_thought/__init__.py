"""Quick-Thought: two sentence encoders trained to pick a sentence's neighbours out of the batch."""

from bertology.families.quick_thought.model import FAMILY

__all__ = ["FAMILY"]
