"""Any Hugging Face causal LM (`model=hf`): a local pretrained dir or a config, trained by every strategy.

`model._target_: framework.models.hf.HFCausalLM` names the wrapper through this package.
"""
from framework.models.hf.model import HFCausalLM

__all__ = ["HFCausalLM"]
