"""A transformers causal LM behind our model interface: token ids in, (batch, seq, vocab) logits out.

`pretrained`: a local directory with config.json and safetensors weights (no hub access); `config`:
a directory or a config.json, for a fresh model initialised by transformers from torch's global seed
(which the model factory sets, so every rank and every layout starts from the same weights).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def hf_config_of(pretrained: Optional[str], config: Optional[str]):
    """The transformers config of `pretrained` (a dir) or `config` (a dir or a config.json)."""
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(pretrained or config)


class HFCausalLM(nn.Module):
    def __init__(self, pretrained: Optional[str] = None, config: Optional[str] = None):
        super().__init__()
        from transformers import AutoModelForCausalLM
        # Under a meta device (the planner's shapes-only build) transformers refuses from_pretrained;
        # the config alone gives the same modules and shapes.
        if pretrained and torch.get_default_device().type != "meta":
            self.model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch.float32)
        elif pretrained:
            self.model = AutoModelForCausalLM.from_config(hf_config_of(pretrained, None), dtype=torch.float32)
        else:
            self.model = AutoModelForCausalLM.from_config(hf_config_of(None, config), dtype=torch.float32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits

    def block_classes(self) -> tuple[type, ...]:
        """The classes transformers itself keeps whole when it splits a model (`_no_split_modules`)."""
        names = set(getattr(self.model, "_no_split_modules", None) or ())
        return tuple({type(m) for m in self.model.modules() if type(m).__name__ in names})
