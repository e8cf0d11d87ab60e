"""Which parameter elements one rank holds, from shapes alone: the model is built on the meta device,
split into the rank's pipeline stages by the model spec, and each parameter's tensor-parallel and
data-parallel sharding is applied to its shape with the rules torch's DTensor uses (a dimension of
size d over n ranks gives the first rank ceil(d / n) rows)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from framework.models import lora
from framework.models.factory import store_parameters
from framework.models.spec import spec_for
from framework.parallel.expert_parallel import expert_layers
from framework.parallel.pipeline import stage_ids
from framework.plan.cache_key import config_key
from framework.plan.layout import Layout

if TYPE_CHECKING:
    from framework.config.schema import Config


@dataclass(frozen=True)
class ParamShape:
    name: str
    full: tuple[int, ...]        # the whole parameter
    local: tuple[int, ...]       # what the first rank of its tp and data-parallel groups holds
    tp_local: tuple[int, ...]    # after tensor parallelism, before data-parallel sharding
    whole_grad: bool = False     # its gradient comes back replicated (a vocab-sharded embedding without FSDP)
    expert: bool = False         # an MoE expert weight: split over the ep ranks where ep > 1, then FSDP leaves it
    trainable: bool = True       # False: no gradient, no optimizer state (an MoE routing bias, a LoRA base)
    itemsize: float = 4          # bytes an element takes as stored (precision.store_dtype, a LoRA base's own)

    @property
    def numel(self) -> int:
        return math.prod(self.local)

    @property
    def grad_numel(self) -> int:
        return self.full_numel if self.whole_grad else self.numel

    @property
    def tp_numel(self) -> int:
        return math.prod(self.tp_local)

    @property
    def full_numel(self) -> int:
        return math.prod(self.full)


def chunk(size: int, ranks: int) -> int:
    """Rows the first of `ranks` ranks holds of a dimension of `size` (torch.chunk / DTensor Shard)."""
    return min(size, -(-size // ranks))


def _tp_dim(module: nn.Module, attr: str, style) -> int | None:
    """The dimension of `module.attr` a tensor-parallel style shards, None where it replicates."""
    embedding = isinstance(module, nn.Embedding)
    if isinstance(style, ColwiseParallel):
        return 1 if embedding else 0
    if isinstance(style, RowwiseParallel):
        if embedding:
            return 0
        return 1 if attr == "weight" else None
    return None


_META: dict[str, nn.Module] = {}
_SHAPES: dict[tuple, list] = {}


def _model_key(cfg: Config) -> str:
    lora_cfg = cfg.get("lora")
    return (config_key(cfg.model) + (config_key(lora_cfg) if lora_cfg is not None and lora_cfg.enabled else "")
            + str(cfg.precision.get("store_dtype")))


def meta_model(cfg: Config) -> nn.Module:
    """The job's model on the meta device, with its adapters (lora.enabled: only they train), its parameters in
    precision.store_dtype."""
    key = _model_key(cfg)
    if key not in _META:
        spec = spec_for(cfg.model)
        with torch.device("meta"):
            model = spec.build(cfg.model)
        lora_cfg = cfg.get("lora")
        if lora_cfg is not None and lora_cfg.enabled:
            names = lora.target_linears(model, spec.block_classes(model), lora_cfg.targets, spec.lora_skip())
            lora.apply_lora(model, names, lora_cfg.rank, lora_cfg.alpha, lora_cfg.dropout, lora_cfg.dora)
        _META[key] = store_parameters(model, cfg.precision.get("store_dtype"))
    return _META[key]


def _itemsize(cfg: Config, module: nn.Module, attr: str, p) -> float:
    """Bytes an element of the parameter takes as the job stores it: an adapted linear's frozen weight in
    lora.base_dtype (NF4: 4 bits plus a double-quantised scale a block; float8: a byte plus a row scale)."""
    if isinstance(module, lora.LoRALinear) and attr == "weight":
        dtype = cfg.lora.base_dtype
        if dtype == "nf4":
            block, _ = lora.nf4_blocks(p.numel())
            return 0.5 + 1 / block
        if dtype == "float8":
            return 1 + 4 / p.shape[1]
        return 2 if dtype == "bfloat16" else 4
    return p.element_size()


_STAGES: dict[tuple, nn.Module] = {}


def stage_modules(cfg: Config, layout: Layout, pp_rank: int) -> list[nn.Module]:
    """The modules rank `pp_rank` of the pipeline holds, on the meta device (each stage split once: a split
    copies the model)."""
    model = meta_model(cfg)
    if layout.pp == 1:
        return [model]
    stages = layout.pp * layout.virtual_stages
    ids = stage_ids(pp_rank, layout.pp, layout.virtual_stages, layout.pp_schedule)
    key = _model_key(cfg)
    for i in ids:
        if (key, i, stages) not in _STAGES:
            _STAGES[key, i, stages] = spec_for(cfg.model).pipeline_stage(model, i, stages)
    return [_STAGES[key, i, stages] for i in ids]


def rank_parameters(cfg: Config, layout: Layout, pp_rank: int = 0) -> list[ParamShape]:
    """Every parameter (each tied one once per module that holds it) of pipeline rank `pp_rank`."""
    key = (_model_key(cfg), layout.strategy, layout.tp, layout.pp, layout.virtual_stages,
           layout.pp_schedule, layout.sequence_parallel, layout.dp_replicate, layout.dp_shard, layout.zero, pp_rank,
           layout.cp, layout.ep)
    if key not in _SHAPES:
        _SHAPES[key] = _rank_parameters(cfg, layout, pp_rank)
    return _SHAPES[key]


def _rank_parameters(cfg: Config, layout: Layout, pp_rank: int) -> list[ParamShape]:
    spec = spec_for(cfg.model)
    tied = {name for pair in spec.tied_parameters(cfg.model) for name in pair}
    shapes = []
    for module in stage_modules(cfg, layout, pp_rank):
        plan = spec.tensor_parallel_plan(module, layout.sequence_parallel) if layout.tp > 1 else {}
        plan = plan or {}
        experts = {id(p) for layer in expert_layers(module) for p in layer.experts.parameters()}
        for name, p in module.named_parameters():
            owner, _, attr = name.rpartition(".")
            full = tuple(p.shape)
            tp_local = list(full)
            style = plan.get(owner)
            dim = _tp_dim(module.get_submodule(owner), attr, style) if style is not None else None
            if dim is not None:
                tp_local[dim] = chunk(full[dim], layout.tp)
            local = list(tp_local)
            fsdp = layout.sharding == "unit" and layout.dp * layout.cp > 1
            expert = id(p) in experts
            if expert and layout.ep > 1:
                local[0] = chunk(local[0], layout.ep)
            elif layout.shards_params and layout.sharding == "unit" and local:
                local[0] = chunk(local[0], layout.shard_ranks)
            # DTensor's embedding backward (vocab-sharded, replicated input) returns a replicated gradient;
            # FSDP's reduce-scatter puts it back in the parameter's layout.
            # A tied embedding's gradient is summed with the head's, which keeps the sharded layout.
            whole_grad = (dim is not None and isinstance(style, RowwiseParallel) and not fsdp
                          and isinstance(module.get_submodule(owner), nn.Embedding) and name not in tied)
            shapes.append(ParamShape(name, full, tuple(local), tuple(tp_local), whole_grad, expert, p.requires_grad,
                                     _itemsize(cfg, module.get_submodule(owner), attr, p)))
    return shapes
