"""A GPT-2 style family: the model, its parallel plans, its Hugging Face layout and its spec.

`model._target_: framework.models.gpt2.GPT2` names the class through this package.
"""
from framework.models.gpt2.model import GPT2, GPT2Args

__all__ = ["GPT2", "GPT2Args"]
