"""Skip-Thought: a sentence encoder trained to generate the sentences before and after it."""

from bertology.families.skip_thought.model import FAMILY

__all__ = ["FAMILY"]
