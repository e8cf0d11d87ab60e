"""Our mixture-of-experts family: the model, its parallel plans, its Hugging Face (Mixtral) layout and its spec.

`model._target_: framework.models.moe.MoETransformer` names the class through this package.
"""
from framework.models.moe.model import MoEArgs, MoETransformer

__all__ = ["MoEArgs", "MoETransformer"]
