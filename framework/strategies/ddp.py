"""Data parallel: a full replica per rank, gradients all-reduced by DistributedDataParallel.

zero=stage1 shards the optimizer states across ranks with torch's ZeroRedundancyOptimizer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.config.schema import Config, ParallelConfig
from framework.errors import ConfigError
from framework.runtime.world import OPEN_CPU_WORKERS
from framework.strategies.torch_strategy import TorchStrategy, TorchTraits
from framework.strategies.traits import AutoLayout

# torch.distributed.optim (its functional optimizers compile TorchScript on import, ~0.3 s) and DDP are
# imported where a worker uses them: the launcher imports this module only to validate.
COMM_HOOKS = {"none": None, "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}


@dataclass
class DDPOptions(ParallelConfig):
    name: str = "ddp"
    bucket_cap_mb: float = 25.0             # size of DDP's gradient all-reduce buckets
    gradient_as_bucket_view: bool = False   # gradients are views into the buckets (saves one gradient copy)
    static_graph: bool = False              # the graph is the same every step (lets DDP skip per-step bookkeeping)
    find_unused_parameters: bool = False    # allow parameters that get no gradient in a step
    comm_hook: str = "none"          # none | fp16 | bf16: compress gradients for the all-reduce


class DDPTraits(TorchTraits):
    """What parallel=ddp declares for the launcher, validation and the planner."""
    name = "ddp"
    options = DDPOptions
    default_workers = OPEN_CPU_WORKERS
    zero_support = {0: None, 1: None,
                    2: "gradient sharding is done by parallel=fsdp or parallel=deepspeed",
                    3: "parameter sharding is done by parallel=fsdp or parallel=deepspeed"}
    precisions = ("fp32", "bf16", "fp16", "float8")
    activation_checkpointing = ("none", "full", "layer", "op")
    worker_modules = (*TorchTraits.worker_modules, "torch.nn.parallel",
                      "torch.distributed.algorithms.ddp_comm_hooks.default_hooks")
    # what the planner reads: replicas (dp_sharding's default) whose gradients sync once a step (no_sync)
    machinery = 1
    adapter_base_dtypes = ("float32", "bfloat16", "float8", "nf4")

    @classmethod
    def gradient_copy(cls, cfg: Config) -> bool:
        """DDP's buckets hold a second copy of the gradients unless the gradients are views into them."""
        return not cfg.parallel.get("gradient_as_bucket_view", False)

    @classmethod
    def auto_layouts(cls, cfg: Config, world_size: int, per_node: int) -> list[AutoLayout]:
        if world_size == 1:
            return []
        return [AutoLayout(zero, (), world_size) for zero in cls.accepted_zero_stages()]

    @classmethod
    def worker_preload(cls, cfg: Config) -> tuple[str, ...]:
        # ZeroRedundancyOptimizer's package compiles TorchScript on import (~0.5 s): only where it runs
        return (*cls.worker_modules, *(("torch.distributed.optim",) if cfg.zero.stage == 1 else ()))

    @classmethod
    def check(cls, cfg: Config, world_size: int) -> None:
        if cfg.parallel.comm_hook not in COMM_HOOKS:
            raise ConfigError("parallel.comm_hook", f"unknown hook {cfg.parallel.comm_hook!r}; "
                                                    f"use one of {', '.join(COMM_HOOKS)}")
        if cfg.parallel.comm_hook == "bf16" and not torch.cuda.is_available():
            raise ConfigError("parallel.comm_hook", "bf16 gradient compression needs CUDA with NCCL; "
                                                    "on this machine use parallel.comm_hook=fp16")
        accumulation = cls.batch_layout(cfg, world_size).accumulation
        if cfg.parallel.static_graph and accumulation > 1:
            raise ConfigError("parallel.static_graph", f"DDP's static graph cannot skip gradient sync, which "
                                                       f"{accumulation} accumulation steps need; set "
                                                       f"trainer.micro_batch_size=global_batch_size/world_size")
        if cfg.precision.reduce_dtype != "float32":
            raise ConfigError("precision.reduce_dtype", "DDP reduces the fp32 gradients autocast leaves; "
                                                        "compress them with parallel.comm_hook instead")
        if cfg.parallel.bucket_cap_mb <= 0:
            raise ConfigError("parallel.bucket_cap_mb", f"must be positive, got {cfg.parallel.bucket_cap_mb}")
        if cfg.zero.offload_optimizer or cfg.zero.offload_params:
            raise ConfigError("zero", "parallel=ddp cannot offload; parallel=deepspeed offloads optimizer "
                                      "states and parameters, parallel=fsdp offloads parameters")


class DDPStrategy(DDPTraits, TorchStrategy):
    """The worker side of parallel=ddp: DistributedDataParallel, and ZeroRedundancyOptimizer at zero=stage1."""

    def wrap_model(self, model):
        opts = self.cfg.parallel
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel
        # Frozen parameters never change and start alike on every rank (seeded, or read from one file): DDP need
        # not broadcast them at wrapping, which quantised frozen weights (lora.base_dtype) could not take.
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [name for name, p in model.named_parameters() if not p.requires_grad])
        ddp = DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=opts.bucket_cap_mb,
            gradient_as_bucket_view=opts.gradient_as_bucket_view,
            static_graph=opts.static_graph,
            find_unused_parameters=opts.find_unused_parameters,
        )
        hook = COMM_HOOKS[opts.comm_hook]
        if hook is not None:
            ddp.register_comm_hook(state=None, hook=getattr(default_hooks, hook))
        return ddp

    def make_optimizer(self, model, build_optimizer):
        if self.cfg.zero.stage == 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            return ZeroRedundancyOptimizer(build_optimizer.param_groups(model),
                                           optimizer_class=build_optimizer.cls, **build_optimizer.kwargs)
        return build_optimizer(model)

    def accumulation_context(self, is_last: bool):
        return super().accumulation_context(is_last) if is_last else self.model.no_sync()

    def unwrapped_model(self):
        return self.model.module

    @property
    def _zero1(self) -> bool:
        """The optimizer is torch's ZeroRedundancyOptimizer around the user's."""
        return self.cfg.zero.stage == 1

    def checkpoint_optimizer(self):
        # ZeRO-1: each rank saves and loads the states of the parameters it owns, by name.
        if self._zero1:
            return self.optimizer.optim
        return self.optimizer

    def optimizer_states(self):
        if self._zero1:
            return self.optimizer.optim.state.values()
        return super().optimizer_states()
