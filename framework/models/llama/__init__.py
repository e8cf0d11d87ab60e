"""Our Llama family: the model, its parallel plans, its Hugging Face layout and its spec.

`model._target_: framework.models.llama.Llama` names the class through this package.
"""
from framework.models.llama.model import Llama, LlamaArgs, init_weights

__all__ = ["Llama", "LlamaArgs", "init_weights"]
