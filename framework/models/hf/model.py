"""A transformers causal LM behind our model interface: token ids in, (batch, seq, vocab) logits out.

`pretrained`: a local directory with config.json and safetensors weights (no hub access); `config`:
a directory or a config.json, for a fresh model initialised by transformers from torch's global seed
(which the model factory sets, so every rank and every layout starts from the same weights).
transformers comes with the `hf` extra; without it, `model=hf` is a configuration error naming it.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import nn

from framework.errors import ConfigError
from framework.models.documents import positions_in_documents
from framework.models.loss import deferred_logits
from framework.models.moe.balance import with_aux_loss


def require_transformers():
    """The transformers module, or ConfigError naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("model", "model=hf needs the transformers package, which is not installed; "
                                   "pip install 'framework[hf]'") from None
    return transformers


def head_not_deferrable(hf_cfg) -> str | None:
    """Why the loss cannot project this architecture's hidden states itself (None: it can: its logits are its
    output embedding applied to the base model's last hidden states, as in Llama, GPT-2, Qwen, Mistral)."""
    if getattr(hf_cfg, "output_router_logits", False):
        return "its router loss is computed from the logits inside its own head"
    for key in ("final_logit_softcapping", "logit_scale"):
        if getattr(hf_cfg, key, None):
            return f"its head applies {key} to the logits"
    return None


#: transformers never runs code a model dir brings (its auto_map's modules): a dir may come from a checkpoint's
#: config, and transformers would otherwise ask on stdin, or run it where told to
NO_REMOTE_CODE = {"trust_remote_code": False}


def hf_config_of(pretrained: Optional[str], config: Optional[str]):
    """The transformers config of `pretrained` (a dir) or `config` (a dir or a config.json)."""
    return require_transformers().AutoConfig.from_pretrained(pretrained or config, **NO_REMOTE_CODE)


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside create their parameters on the meta device (each is allocated on the host only
    while its module's constructor runs) and their buffers (RoPE tables) on the host, computed as usual: a
    skeleton whose shards a rank then allocates and fills by name."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


class HFCausalLM(nn.Module):
    def __init__(self, pretrained: Optional[str] = None, config: Optional[str] = None, load_weights: bool = True,
                 loss_chunk_tokens: int = 0):
        """`load_weights=False` builds `pretrained`'s architecture without reading its weights (the caller
        fills them, e.g. each rank its own shards). `loss_chunk_tokens` > 0: in training, return the last
        hidden states and leave the output embedding to the loss, chunk by chunk (framework/models/loss.py)."""
        super().__init__()
        self.loss_chunk_tokens = loss_chunk_tokens
        transformers = require_transformers()
        # Under a meta device (the planner's shapes-only build) transformers refuses from_pretrained;
        # the config alone gives the same modules and shapes.
        if pretrained and load_weights and torch.get_default_device().type != "meta":
            self.model = transformers.AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch.float32,
                                                                           **NO_REMOTE_CODE)
        else:
            self.model = transformers.AutoModelForCausalLM.from_config(hf_config_of(pretrained, config),
                                                                       dtype=torch.float32, **NO_REMOTE_CODE)

    def forward(self, tokens: torch.Tensor, documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits; a mixture-of-experts class whose config asks for output_router_logits (Mixtral, Qwen3-MoE)
        also sends router_aux_loss_coef x its load-balancing loss into the gradient, weighted like the
        micro-batch's LM loss (as our MoE family does), since the framework computes the loss itself.

        `documents` (packed documents' numbers): the position ids restart at each document, from which
        transformers builds the same block-causal attention (its packed-sequence masks)."""
        config = self.model.config
        extra = {} if documents is None else {"position_ids": positions_in_documents(documents)}
        if self.training and self.loss_chunk_tokens:
            hidden = self.model.base_model(input_ids=tokens, use_cache=False, **extra).last_hidden_state
            return deferred_logits(hidden, self.model.get_output_embeddings(), self.loss_chunk_tokens)
        if not (self.training and getattr(config, "output_router_logits", False)):
            return self.model(input_ids=tokens, use_cache=False, **extra).logits
        out = self.model(input_ids=tokens, use_cache=False, output_router_logits=True, **extra)
        return with_aux_loss(out.logits, out.aux_loss, getattr(config, "router_aux_loss_coef", 0.0))

    def block_classes(self) -> tuple[type, ...]:
        """The classes transformers itself keeps whole when it splits a model (`_no_split_modules`)."""
        names = set(getattr(self.model, "_no_split_modules", None) or ())
        return tuple({type(m) for m in self.model.modules() if type(m).__name__ in names})
