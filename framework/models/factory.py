"""How a strategy gets its model, without knowing which model it is.

Called as a function it returns the full model, initialised (seeded by name where the spec can, else
from torch's global seed) or loaded from checkpoint.initial_load. Sharded layouts instead take the
skeleton on the meta device (`meta()`), split and shard it, then `materialize` it: every rank
allocates only its own shards and fills each with its slice of the seeded (or loaded) full parameter.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from framework.models.spec import ModelSpec, spec_for


class ModelFactory:
    def __init__(self, cfg):
        self.model_cfg = cfg.model
        self.seed = cfg.seed
        self.initial_load = cfg.checkpoint.initial_load
        self.spec: ModelSpec = spec_for(cfg.model)
        self._hf_weights = None

    def skeleton(self) -> nn.Module:
        """The model as its class builds it (torch's seeded default init), under the caller's device context."""
        torch.manual_seed(self.seed)
        return self.spec.build(self.model_cfg)

    def __call__(self) -> nn.Module:
        """The full model, initialised; on the meta device it is left empty."""
        model = self.skeleton()
        if any(p.is_meta for p in model.parameters()):
            return model
        self.spec.init_weights(model, self.model_cfg, self.seed)
        if self.initial_load:
            weights = self._weights()
            with torch.no_grad():
                for name, param in model.named_parameters():
                    param.copy_(weights.full(name))
        return model

    @property
    def can_materialize(self) -> bool:
        """Whether a rank can fill its shards alone: the spec initialises each parameter from (seed, name)."""
        return self.spec.init_by_name

    def meta(self) -> nn.Module:
        with torch.device("meta"):
            return self.skeleton()

    def _weights(self):
        if self._hf_weights is None:
            self._hf_weights = self.spec.hf_weights(self.initial_load, self.model_cfg)
        return self._hf_weights

    def full_parameter(self, name: str, shape) -> torch.Tensor:
        """The full fp32 initial value of parameter `name`: loaded from initial_load, else seeded by name
        (a tied parameter's copy on another pipeline stage takes the canonical name's value)."""
        name = dict((alias, canonical) for canonical, alias in self.spec.tied_parameters(self.model_cfg)).get(name, name)
        if self.initial_load:
            return self._weights().full(name)
        full = torch.empty(tuple(shape), dtype=torch.float32)
        self.spec.init_parameter(self.model_cfg, name, full, self.seed)
        return full

    @torch.no_grad()
    def materialize(self, module: nn.Module, device: torch.device) -> None:
        """Allocate `module`'s (possibly sharded, possibly one stage's) parameters on `device` and fill them
        with their slice of the full initial value, one parameter at a time."""
        module.to_empty(device=device)
        for name, param in module.named_parameters():
            full = self.full_parameter(name, param.shape)
            if isinstance(param, DTensor):
                shape, offset = compute_local_shape_and_global_offset(full.shape, param.device_mesh,
                                                                      param.placements)
                full = full[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
                param = param.to_local()
            param.copy_(full)

    def flops_per_token(self, seq_len: int) -> float:
        return self.spec.flops_per_token(self.model_cfg, seq_len)
