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

    def __call__(self) -> nn.Module:
        """The full model under the current default device; on the meta device it is left empty."""
        torch.manual_seed(self.seed)
        model = self.spec.build(self.model_cfg)
        if any(p.is_meta for p in model.parameters()):
            return model
        self.spec.init_weights(model, self.model_cfg, self.seed)
        if self.initial_load:
            self._load_full(model)
        return model

    @property
    def can_materialize(self) -> bool:
        """Whether a rank can fill its shards alone (per-name init, or weights read one tensor at a time)."""
        return self.spec.init_by_name

    def meta(self) -> nn.Module:
        with torch.device("meta"):
            return self.spec.build(self.model_cfg)

    @torch.no_grad()
    def _load_full(self, model: nn.Module) -> None:
        weights = self.spec.hf_weights(self.initial_load, self.model_cfg)
        for name, param in model.named_parameters():
            param.copy_(weights.full(name))

    @torch.no_grad()
    def materialize(self, module: nn.Module, device: torch.device) -> None:
        """Allocate `module`'s (possibly sharded, possibly one stage's) parameters on `device` and fill them."""
        module.to_empty(device=device)
        weights = self.spec.hf_weights(self.initial_load, self.model_cfg) if self.initial_load else None
        for name, param in module.named_parameters():
            if weights is not None:
                full = weights.full(name)
            else:
                full = torch.empty(param.shape, dtype=torch.float32)
                self.spec.init_parameter(self.model_cfg, name, full, self.seed)
            if isinstance(param, DTensor):
                shape, offset = compute_local_shape_and_global_offset(full.shape, param.device_mesh,
                                                                      param.placements)
                full = full[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
                param = param.to_local()
            param.copy_(full)

    def flops_per_token(self, seq_len: int) -> float:
        return self.spec.flops_per_token(self.model_cfg, seq_len)
