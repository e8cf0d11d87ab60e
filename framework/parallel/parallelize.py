"""The one parallelize path of the torch-native sharded layouts (parallel=fsdp is parallel=3d with tp = pp = 1).

Order, as torch's composable APIs expect: pipeline split -> float8 linears -> tensor parallel -> expert
parallel (MoE experts over the data-parallel ranks, left out of FSDP) -> activation checkpointing -> compile
(per block) -> FSDP2 over the data-parallel dims -> materialise. Where the model
spec can fill a parameter from (seed, name), the model is built on the meta device and every rank
allocates only its own shards; otherwise (a model the framework knows nothing about) it is built in
full on every rank from torch's seed and then sharded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from framework.models.factory import ModelFactory
from framework.parallel.build_order import checkpoint_compile_wrap
from framework.parallel.expert_parallel import apply_expert_parallel
from framework.parallel.float8 import convert_float8
from framework.parallel.fsdp import apply_fsdp
from framework.parallel.mesh import Meshes
from framework.parallel.tensor_parallel import apply_tensor_parallel
from framework.parallel.tied import retie
from framework.runtime.host_memory import returning_large_frees


@dataclass
class ShardingPlan:
    """How the data-parallel dims shard (or replicate) each stage."""
    enabled: bool                               #: apply FSDP2 at all
    reshard_after_forward: bool = True          #: zero=stage3 (True) or stage2 (False)
    mp_policy: Optional[MixedPrecisionPolicy] = None
    offload: bool = False
    wrap_classes: list = field(default_factory=list)   #: FSDP units; empty = the spec's blocks


def parallelize(model_factory: ModelFactory, meshes: Meshes, cfg, device: torch.device, sharding: ShardingPlan,
                stage_ids: tuple[int, ...] = (0,), num_stages: int = 1) -> list[nn.Module]:
    """This rank's stage modules, split, sharded and filled with their initial weights."""
    spec = model_factory.spec
    on_meta = model_factory.can_materialize
    full = model_factory.meta() if on_meta else model_factory().to(device)
    if num_stages > 1:
        modules = [spec.pipeline_stage(full, i, num_stages) for i in stage_ids]
    else:
        modules = [full]

    def shard(module: nn.Module, experts: set) -> nn.Module:
        if not sharding.enabled:
            return module
        return apply_fsdp(module, meshes.fsdp, reshard_after_forward=sharding.reshard_after_forward,
                          mp_policy=sharding.mp_policy, offload=sharding.offload, ignored_params=experts,
                          block_classes=list(sharding.wrap_classes) or spec.block_classes(module))

    for module in modules:
        convert_float8(module, cfg.precision, spec, fsdp=sharding.enabled)
        if meshes.tp.size() > 1:
            apply_tensor_parallel(module, meshes.tp, spec.tensor_parallel_plan(module, cfg.parallel.sequence_parallel))
            retie(module, spec.tied_parameters(cfg.model))
        experts = apply_expert_parallel(module, meshes.dp, meshes.cp) if cfg.parallel.ep > 1 else set()
        checkpoint_compile_wrap(module, cfg, spec, lambda m: shard(m, experts))
        if on_meta:
            # Offloaded shards live in CPU memory; FSDP2 moves them to the device per use.
            with returning_large_frees():
                model_factory.materialize(module, torch.device("cpu") if sharding.offload else device)
    return modules
