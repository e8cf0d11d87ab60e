"""Fully sharded data parallel on FSDP2 (`fully_shard`): every block, then the root.

zero=stage3 reshards parameters after each block's forward; zero=stage2 keeps them gathered until
backward. Gradients and optimizer states are sharded either way. HSDP: parallel.dp_replicate x
parallel.dp_shard on a 2-D mesh, shards within a group and replicas across groups.
Precision becomes FSDP2's MixedPrecisionPolicy; fp16 loss scaling comes from the precision plug-in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from framework.config.errors import ConfigError
from framework.config.schema import ParallelConfig
from framework.parallel.blocks import has_default_blocks
from framework.parallel.fsdp import apply_fsdp, mixed_precision_policy
from framework.strategies.base import TorchStrategy


@dataclass
class FSDPOptions(ParallelConfig):
    name: str = "fsdp"
    dp_replicate: int = 1       # HSDP replica groups; -1 = the rest of the world size
    dp_shard: int = -1          # ranks a parameter is sharded over; -1 = the rest of the world size
    wrap_classes: list[str] = field(default_factory=list)   # block class names; empty = model.block_classes()


def data_parallel_degrees(opts, world_size: int) -> tuple[int, int]:
    """(dp_replicate, dp_shard) with -1 resolved; raises ConfigError naming the numbers."""
    rep, shard = opts.dp_replicate, opts.dp_shard
    for key, value in (("parallel.dp_replicate", rep), ("parallel.dp_shard", shard)):
        if value == 0 or value < -1:
            raise ConfigError(key, f"must be positive or -1 (the rest of the world size), got {value}")
    if rep == -1 and shard == -1:
        raise ConfigError("parallel.dp_replicate", "only one of dp_replicate and dp_shard may be -1")
    known = max(rep, 1) * max(shard, 1)
    if -1 in (rep, shard):
        if world_size % known:
            raise ConfigError("launcher.nproc_per_node", f"world size {world_size} is not divisible by "
                                                         f"parallel.dp_{'shard' if rep == -1 else 'replicate'}={known}")
        return (world_size // known, shard) if rep == -1 else (rep, world_size // known)
    if known != world_size:
        raise ConfigError("parallel.dp_shard", f"dp_replicate x dp_shard = {rep} x {shard} = {known} does not "
                                               f"match the world size {world_size} (launcher.nproc_per_node)")
    return rep, shard


class FSDPStrategy(TorchStrategy):
    name = "fsdp"
    options = FSDPOptions
    zero_support = {0: "parallel=fsdp always shards gradients and optimizer states: use zero=stage2 or "
                       "zero=stage3 (also parameters); parallel=ddp replicates without sharding",
                    1: "sharding only optimizer states is parallel=ddp zero=stage1 (or parallel=deepspeed); "
                       "fsdp does zero=stage2 and zero=stage3",
                    2: None, 3: None}
    precisions = ("fp32", "bf16", "fp16")
    activation_checkpointing = ("none", "full", "selective")
    precision_autocast = False

    @classmethod
    def default_world_size(cls, cfg) -> int:
        rep, shard = cfg.parallel.dp_replicate, cfg.parallel.dp_shard
        known = max(rep, 1) * max(shard, 1)
        return max(2, known) if -1 in (rep, shard) else known

    @classmethod
    def validate(cls, cfg, world_size: int) -> None:
        super().validate(cfg, world_size)
        data_parallel_degrees(cfg.parallel, world_size)
        if cfg.zero.offload_optimizer and not cfg.zero.offload_params:
            raise ConfigError("zero.offload_optimizer", "parallel=fsdp offloads parameters, gradients and "
                                                        "optimizer states together: set zero.offload_params=true; "
                                                        "parallel=deepspeed offloads optimizer states alone")
        if not cfg.parallel.wrap_classes:
            from hydra.utils import get_class
            if not has_default_blocks(get_class(cfg.model._target_)):
                raise ConfigError("parallel.wrap_classes", f"{cfg.model._target_} has no block_classes(); "
                                                           f"name the block classes to shard")

    def build_mesh(self):
        rep, shard = data_parallel_degrees(self.cfg.parallel, self.world_size)
        if rep == 1:
            return init_device_mesh(self.device.type, (shard,), mesh_dim_names=("dp_shard",))
        return init_device_mesh(self.device.type, (rep, shard), mesh_dim_names=("dp_replicate", "dp_shard"))

    def wrap_model(self, model):
        self.mesh = self.build_mesh()
        zero = self.cfg.zero
        return apply_fsdp(model, self.mesh, reshard_after_forward=zero.stage == 3,
                          mp_policy=mixed_precision_policy(self.cfg.precision),
                          offload=zero.offload_params, block_classes=self.cfg.parallel.wrap_classes)

    def clip_grad_norm(self, max_grad_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if max_grad_norm > 0 and math.isfinite(max_grad_norm):
            torch.nn.utils.clip_grads_with_norm_(params, max_grad_norm, norm)
        # A DTensor norm holds partial sums of the shards; full_tensor() reduces them.
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
