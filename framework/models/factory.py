"""How a strategy gets its model, without knowing which model it is.

Called as a function it returns the full model, initialised (seeded by name where the spec can, else
from torch's global seed) or loaded from checkpoint.initial_load (or the model's own weights dir,
model=hf's pretrained). Sharded layouts instead take the skeleton on the meta device (`meta()`), split
and shard it, then `materialize` it: every rank allocates only its own shards and fills each with its
slice of the seeded full parameter, or reads only that slice from the safetensors files.
With precision.store_dtype=bfloat16 the parameters are held in bf16 either way: the fp32 initial value rounded.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from framework import storage
from framework.models import lora
from framework.models.spec import ModelSpec, spec_for


def store_parameters(model: nn.Module, store_dtype: str | None) -> nn.Module:
    """precision.store_dtype=bfloat16: every trained parameter of `model` held in bf16, its value rounded to nearest
    (float32 or None: as built, a LoRA base in lora.base_dtype). One the model moves itself, without a gradient (MoE's
    expert_bias, in steps far below a bf16 step), and buffers (RoPE tables) keep their dtype, as FSDP2's policy leaves
    them; a tied parameter stays one."""
    if store_dtype == "bfloat16":
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
    return model


class ModelFactory:
    def __init__(self, cfg):
        self.model_cfg = cfg.model
        self.store_dtype = cfg.precision.get("store_dtype")
        self.seed = cfg.seed
        # a URL's files are downloaded once per machine (safetensors reads local files)
        self.initial_load = storage.local_copy(cfg.checkpoint.initial_load) if cfg.checkpoint.initial_load else None
        self.lora = cfg.get("lora") if cfg.get("lora") is not None and cfg.lora.enabled else None
        self.spec: ModelSpec = spec_for(cfg.model)
        self.spec.prepare(cfg.model)
        # where the initial weights are read from: the user's initial_load over the model's own
        self.weights_dir = self.initial_load or self.spec.weights_dir(cfg.model)
        self._hf_weights = None

    def skeleton(self) -> nn.Module:
        """The model as its class builds it (torch's seeded default init) under the caller's device context,
        without reading a weights dir of its own: what materialize / full_parameter then fill."""
        torch.manual_seed(self.seed)
        return self._adapted(self.spec.build(self.model_cfg, load_weights=not self.can_materialize))

    def __call__(self) -> nn.Module:
        """The full model, initialised (or loaded); on the meta device it is left empty. With lora.enabled its
        block linears carry adapters (initialised) and only those train."""
        torch.manual_seed(self.seed)
        model = self.spec.build(self.model_cfg)
        if any(p.is_meta for p in model.parameters()):
            return store_parameters(self._adapted(model), self.store_dtype)
        self.spec.init_weights(model, self.model_cfg, self.seed)
        if self.initial_load:
            weights = self._weights()
            with torch.no_grad():
                for name, param in model.named_parameters():
                    param.copy_(weights.full(name))
        model = self._adapted(model)
        if self.lora is not None:
            with torch.no_grad():
                params = dict(model.named_parameters())
                for name, param in params.items():
                    if lora.is_adapter(name):
                        lora.init_adapter(name, param, self.seed, params[lora.base_of(name)])
            lora.store_base(model, self.lora.base_dtype)
        return store_parameters(model, self.store_dtype)

    def lora_names(self, model: nn.Module) -> list[str]:
        """The linears lora.* adapts in this model."""
        return lora.target_linears(model, self.spec.block_classes(model), self.lora.targets,
                                   self.spec.lora_skip())

    def _adapted(self, model: nn.Module) -> nn.Module:
        """The model with adapters on its block linears (lora.enabled; else as it is). On the meta device a
        bfloat16 base is cast there already, so that sharding lays it out in that dtype."""
        if self.lora is None:
            return model
        c = self.lora
        lora.apply_lora(model, self.lora_names(model), c.rank, c.alpha, c.dropout, c.dora)
        if any(p.is_meta for p in model.parameters()) and c.base_dtype == "bfloat16":
            lora.store_base(model, c.base_dtype)
        return model

    @property
    def can_materialize(self) -> bool:
        """Whether a rank can fill its shards alone: the spec initialises each parameter from (seed, name),
        or the weights are read by name from a dir of the model's own."""
        return self.spec.init_by_name or self.spec.weights_dir(self.model_cfg) is not None

    def meta(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return store_parameters(self._adapted(self.spec.meta_skeleton(self.model_cfg)), self.store_dtype)

    def _weights(self):
        if self._hf_weights is None:
            self._hf_weights = self.spec.hf_weights(self.weights_dir, self.model_cfg)
        return self._hf_weights

    def full_parameter(self, name: str, shape, index: tuple | None = None, shapes: dict | None = None) -> torch.Tensor:
        """The fp32 initial value of parameter `name` (only `index`, a tuple of slices, where given): read
        from the weights dir, else seeded by name (a tied parameter's copy on another pipeline stage takes
        the canonical name's value). A reader with `part` reads no more than the slice from disk. An adapter's
        value is seeded by its name (a DoRA magnitude: the norms of its base weight, whose full shape `shapes`
        gives)."""
        name = dict((alias, canonical) for canonical, alias in self.spec.tied_parameters(self.model_cfg)).get(name, name)
        if lora.is_adapter(name):
            base_name = lora.base_of(name)
            base = self.full_parameter(base_name, shapes[base_name]) if name.endswith("lora_magnitude") else None
            full = torch.empty(tuple(shape), dtype=torch.float32)
            lora.init_adapter(name, full, self.seed, base)
            return full if index is None else full[index]
        if self.weights_dir:
            weights = self._weights()
            if index is not None and hasattr(weights, "part"):
                return weights.part(name, index)
            full = weights.full(name)
        else:
            full = torch.empty(tuple(shape), dtype=torch.float32)
            self.spec.init_parameter(self.model_cfg, name, full, self.seed)
        return full if index is None else full[index]

    @torch.no_grad()
    def materialize(self, module: nn.Module, device: torch.device) -> None:
        """Allocate `module`'s (possibly sharded, possibly one stage's) parameters on `device` and fill them
        with their slice of the full initial value, one parameter at a time. Buffers the skeleton computed
        on the host (RoPE tables) keep their values."""
        buffers = {name: b for name, b in module.named_buffers() if not b.is_meta}
        module.to_empty(device=device)
        for name, buffer in module.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])
        shapes = {name: param.shape for name, param in module.named_parameters()}
        for name, param in module.named_parameters():
            full_shape, index = param.shape, None
            if isinstance(param, DTensor):
                shape, offset = compute_local_shape_and_global_offset(full_shape, param.device_mesh,
                                                                      param.placements)
                index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
                param = param.to_local()
            param.copy_(self.full_parameter(name, full_shape, index, shapes))

    def flops_per_token(self, seq_len: int) -> float:
        return self.spec.flops_per_token(self.model_cfg, seq_len)
