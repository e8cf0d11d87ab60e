"""The parallel degrees of a job and the named DeviceMesh they span.

Mesh dims, outermost first: pp, dp_replicate, dp_shard, cp, tp. Tensor parallelism is innermost so
its ranks are neighbours (the same node on a GPU cluster); the two data-parallel dims are
adjacent so that together they flatten into one `dp` dim, whose coordinate is the data rank.
Context-parallel ranks (cp) share a data rank and split its sequences; FSDP2 shards over dp_shard x cp
flattened (`dp_shard_cp`, as torchtitan), so cp ranks also split parameters and reduce gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from framework.errors import ConfigError

DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int

    @classmethod
    def from_config(cls, parallel, world_size: int) -> "ParallelDims":
        """Validate the degrees in `parallel.*` against the world size; one may be -1 (the rest)."""
        degrees = {dim: getattr(parallel, dim, 1) for dim in DIMS}     # cp: parallel=3d and fsdp only
        for dim, value in degrees.items():
            if value == 0 or value < -1:
                raise ConfigError(f"parallel.{dim}", f"must be a positive degree or -1 (the rest), got {value}")
        rest = [dim for dim, value in degrees.items() if value == -1]
        if len(rest) > 1:
            raise ConfigError(f"parallel.{rest[1]}", f"only one degree may be -1, got -1 for {' and '.join(rest)}")
        known = math.prod(v for v in degrees.values() if v != -1)
        if rest:
            if world_size % known:
                raise ConfigError(f"parallel.{rest[0]}",
                                  f"-1 takes the rest of the world size {world_size}, which is not divisible "
                                  f"by the other degrees' product {known}")
            degrees[rest[0]] = world_size // known
        product = math.prod(degrees.values())
        if product != world_size and degrees["tp"] == degrees["pp"] == degrees["cp"] == 1:
            rep, shard = degrees["dp_replicate"], degrees["dp_shard"]
            raise ConfigError("parallel.dp_shard", f"dp_replicate x dp_shard = {rep} x {shard} = {product} does not "
                                                   f"match the world size {world_size} (launcher.nproc_per_node)")
        if product != world_size:
            shown = " x ".join(f"{dim}={degrees[dim]}" for dim in DIMS)
            raise ConfigError("parallel", f"{shown} = {product} processes, but the world size is {world_size}; "
                                          f"set launcher.nproc_per_node={product} or change a degree "
                                          f"(one may be -1 for the rest)")
        return cls(**degrees)

    @classmethod
    def degrees_product(cls, parallel) -> int:
        """The world the degrees ask for when nobody says otherwise (-1 counts as 1)."""
        return math.prod(max(1, getattr(parallel, dim, 1)) for dim in DIMS)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def fsdp_size(self) -> int:
        """Ranks a parameter's gradient is averaged over: every data-parallel and context-parallel rank."""
        return self.dp * self.cp

    def replicate_only(self) -> "ParallelDims":
        """The same ranks with every data-parallel rank a full replica (zero=none: HSDP with shard size 1).
        The flattened data rank of each process is unchanged."""
        return replace(self, dp_replicate=self.dp, dp_shard=1)

    def build_mesh(self, device_type: str) -> "Meshes":
        world = init_device_mesh(device_type, tuple(getattr(self, d) for d in DIMS), mesh_dim_names=DIMS)
        dp = world["dp_replicate", "dp_shard"]
        shard, shard_name = world["dp_shard"], "dp_shard"
        if self.cp > 1:
            shard, shard_name = world["dp_shard", "cp"]._flatten("dp_shard_cp"), "dp_shard_cp"
        return Meshes(world=world, pp=world["pp"], tp=world["tp"], dp=dp._flatten("dp"), cp=world["cp"],
                      # What FSDP2 shards over: 1-D (dp_shard[_cp]), or 2-D (dp_replicate, dp_shard[_cp]) for HSDP.
                      fsdp=world["dp_replicate", shard_name] if self.dp_replicate > 1 else shard)


@dataclass(frozen=True)
class Meshes:
    world: DeviceMesh
    pp: DeviceMesh
    tp: DeviceMesh
    dp: DeviceMesh      # the data-parallel dims flattened: its coordinate is the data rank
    cp: DeviceMesh
    fsdp: DeviceMesh
