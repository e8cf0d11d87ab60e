"""Fully sharded data parallel on FSDP2 (`fully_shard`): every block, then the root.

zero=stage3 reshards parameters after each block's forward; zero=stage2 keeps them gathered until
backward. Gradients and optimizer states are sharded either way. HSDP: parallel.dp_replicate x
parallel.dp_shard on a 2-D mesh, shards within a group and replicas across groups.
Precision becomes FSDP2's MixedPrecisionPolicy; fp16 loss scaling comes from the precision plug-in.
This is parallel=3d's mesh and parallelize path with tp = pp = 1: the model is built on the meta
device and each rank materialises only its shards.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


from framework.errors import ConfigError
from framework.config.schema import Config, ParallelConfig
from framework.parallel.float8 import gathers_float8, precompute_fsdp_scales
from framework.parallel.mesh import ParallelDims
from framework.strategies.torch_strategy import TorchStrategy, TorchTraits, frozen
from framework.strategies.traits import ZERO_SHARDS, AutoLayout


@dataclass
class FSDPOptions(ParallelConfig):
    name: str = "fsdp"
    dp_replicate: int = 1                # HSDP replica groups; -1 = the rest of the world size
    dp_shard: int = -1                      # ranks a parameter is sharded over; -1 = the rest of the world size
    wrap_classes: list[str] = field(default_factory=list)   # FSDP units (block class names); empty = the model's blocks


def sharded_dims(cfg: Config, world_size: int) -> ParallelDims:
    """FSDP2's degrees; zero=none: every data-parallel rank a full replica (HSDP with shard size 1)."""
    dims = ParallelDims.from_config(cfg.parallel, world_size)
    return dims.replicate_only() if cfg.zero.stage == 0 else dims


class UnitSharded:
    """Traits of a strategy that shards FSDP2 units over its data-parallel dims. What the planner reads: stage2
    keeps parameters sharded between steps too (gathered once for forward and backward)."""
    dp_sharding = "unit"
    zero_shards = {2: ZERO_SHARDS[3]}

    @staticmethod
    def shards_units(mesh_dims: ParallelDims) -> bool:
        return True

    @classmethod
    def keeps_gathered(cls, stage: int) -> bool:
        return stage != 3           # FSDP2's reshard_after_forward=False (ShardingPlan reads this)

    @classmethod
    def mesh_dims(cls, cfg: Config, world_size: int) -> ParallelDims:
        return sharded_dims(cfg, world_size)


class UnitShardedStep:
    """The runtime of a strategy whose units gather float8 weights: each optimizer step ends by computing their
    next scales at once; a reference model read without backward gives back what it gathered."""

    @contextlib.contextmanager
    def reference(self):
        with super().reference():
            yield
        if self.reference_model is not None:
            from framework.parallel.fsdp import reshard
            reshard(self.reference_model)

    def optimizer_step(self, max_grad_norm: float):
        grad_norm = super().optimizer_step(max_grad_norm)
        if gathers_float8(self.cfg.precision, self.shards_units(self.mesh_dims(self.cfg, self.world_size))):
            precompute_fsdp_scales([self.model])
        return grad_norm


class FSDPTraits(UnitSharded, TorchTraits):
    """What parallel=fsdp declares for the launcher, validation and the planner."""
    name = "fsdp"
    options = FSDPOptions
    zero_support = {0: "parallel=fsdp always shards gradients and optimizer states: use zero=stage2 or "
                       "zero=stage3 (also parameters); parallel=ddp replicates without sharding",
                    1: "sharding only optimizer states is parallel=ddp zero=stage1 (or parallel=deepspeed); "
                       "fsdp does zero=stage2 and zero=stage3",
                    2: None, 3: None}
    precisions = ("fp32", "bf16", "fp16", "float8")
    activation_checkpointing = ("none", "full", "layer", "op")
    precision_autocast = False
    data_parallel_dims = ("dp_replicate", "dp_shard")
    worker_modules = (*TorchTraits.worker_modules, "framework.parallel.fsdp", "framework.parallel.parallelize")
    # what the planner reads: every micro-batch's backward reduce-scatters its gradients
    reduces_every_micro_batch = True
    machinery = 2
    # FSDP2 shards and all-gathers plain tensors; torchao's quantised weights need their own sharding hooks
    adapter_base_dtypes = ("float32", "bfloat16")

    @classmethod
    def auto_layouts(cls, cfg: Config, world_size: int, per_node: int) -> list[AutoLayout]:
        """Every stage sharded over the world, and HSDP (replicas across nodes, shards within one)."""
        out = []
        if world_size == 1:
            return out
        for zero in cls.accepted_zero_stages():
            out.append(AutoLayout(zero, (("dp_replicate", 1), ("dp_shard", world_size)), world_size))
            if world_size > per_node and world_size % per_node == 0:
                out.append(AutoLayout(zero, (("dp_replicate", world_size // per_node), ("dp_shard", per_node)),
                                      world_size))
        return out

    @classmethod
    def casts_weights(cls, cfg: Config, world_size: int) -> bool:
        return True         # every rank's units gather in param_dtype, one rank included

    @classmethod
    def workers_wanted(cls, cfg: Config) -> int:
        rep, shard = cfg.parallel.dp_replicate, cfg.parallel.dp_shard
        known = max(rep, 1) * max(shard, 1)
        return max(2, known) if -1 in (rep, shard) else known

    @classmethod
    def check(cls, cfg: Config, world_size: int) -> None:
        ParallelDims.from_config(cfg.parallel, world_size)
        if cfg.zero.offload_optimizer and not cfg.zero.offload_params:
            raise ConfigError("zero.offload_optimizer", "parallel=fsdp offloads parameters, gradients and "
                                                        "optimizer states together: set zero.offload_params=true; "
                                                        "parallel=deepspeed offloads optimizer states alone")
        if not cfg.parallel.wrap_classes:
            from framework.models.spec import spec_for
            if not spec_for(cfg.model).has_blocks(cfg.model):
                raise ConfigError("parallel.wrap_classes", f"{cfg.model._target_} has no block_classes(); "
                                                           f"name the block classes to shard")


class FSDPStrategy(FSDPTraits, UnitShardedStep, TorchStrategy):
    """The worker side of parallel=fsdp: the mesh and the model sharded by FSDP2."""

    def setup(self, model_factory, build_optimizer, build_scheduler) -> None:
        # FSDP2 and DTensor load here, in the worker: the launcher imports this module only to validate
        from framework.parallel.fsdp import mixed_precision_policy
        from framework.parallel.parallelize import ShardingPlan, parallelize
        cfg = self.cfg
        self.dims = ParallelDims.from_config(cfg.parallel, self.world_size)
        self.mesh = self.dims.build_mesh(self.device.type)
        sharding = ShardingPlan(enabled=True, reshard_after_forward=not self.keeps_gathered(cfg.zero.stage),
                                mp_policy=mixed_precision_policy(cfg.precision), offload=cfg.zero.offload_params,
                                wrap_classes=cfg.parallel.wrap_classes)
        self.sharding_plan = sharding
        self.model, = parallelize(model_factory, self.mesh, cfg, self.device, sharding)
        self.optimizer = self.make_optimizer(self.model, build_optimizer)
        self.scheduler = build_scheduler(self.optimizer)

    def build_reference(self, model_factory) -> None:
        """The initial model sharded as the policy is (the same mesh, units and mixed precision)."""
        from framework.parallel.parallelize import parallelize
        reference, = parallelize(model_factory, self.mesh, self.cfg, self.device, self.sharding_plan)
        self.reference_model = frozen(reference)
