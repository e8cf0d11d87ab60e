"""3D parallelism: tensor x pipeline x data parallel on one named DeviceMesh.

Build order (as torch's composable APIs expect): split into pipeline stages, then per stage
tensor parallel -> activation checkpointing -> FSDP2 over the data-parallel dims. The model is
created on the meta device; each rank then materializes only its own stages' shards, computed
from the same per-parameter seeds as a single-process run.

Batches (parallel/batch_layout.py): each data-parallel rank (every tp rank of it sees the same batch)
takes global_batch_size / dp sequences per step, as micro-batches of trainer.micro_batch_size, or with
pipelining as parallel.pp_microbatches pipeline micro-batches. zero: stage3 = FSDP2 resharding after forward, stage2 = not, none = every
data-parallel rank a full replica (HSDP with shard size 1); stage1 is refused.

Context parallelism (parallel.cp): the cp ranks of a data rank take the same sequences and each keeps
its load-balanced share of them (framework.parallel.context_parallel); FSDP2 shards over dp_shard x cp
(with zero=none too: cp ranks always split parameters and average gradients).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from framework.errors import ConfigError
from framework.models.spec import spec_for
from framework.parallel.batch_layout import BatchLayout, batch_layout
from framework.parallel.context_parallel import check_context_parallel
from framework.parallel.mesh import ParallelDims
from framework.parallel.pipeline import SPLIT_BACKWARD, build_schedule, canonical_name, stage_ids, validate_pipeline
from framework.runtime.devices import device_type
from framework.strategies.torch_strategy import TorchStrategy, TorchTraits, frozen
from framework.strategies.traits import AutoLayout
from framework.strategies.fsdp import FSDPOptions, FSDPTraits, UnitSharded, UnitShardedStep

if TYPE_CHECKING:
    from framework.config.schema import Config
    from framework.parallel.parallelize import ShardingPlan


# Sequences at least this long also try context parallelism (cp > 1) in parallel=auto: below it one rank's
# activations are rarely what does not fit, and the key/value gathers cost more than they save.
LONG_SEQUENCE = 16384


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Parallel3DOptions(FSDPOptions):
    """parallel=fsdp's options (dp degrees, wrap_classes) plus tensor and pipeline degrees."""
    name: str = "3d"
    tp: int = 2
    pp: int = 2
    #: processes to spawn when a degree is -1 and neither torchrun nor launcher.nproc_per_node sets the world
    rest_world_size: int = 8


class Parallel3DTraits(UnitSharded, TorchTraits):
    """What parallel=3d declares for the launcher, validation and the planner."""
    name = "3d"
    options = Parallel3DOptions
    zero_support = {0: None, 2: None, 3: None,
                    1: "FSDP2 shards gradients together with optimizer states: use zero=stage2, "
                       "or parallel=ddp zero=stage1"}
    activation_checkpointing = ("none", "full", "layer", "op")
    # bf16: FSDP2 all-gathers in precision.param_dtype and reduces in reduce_dtype (the same policy as
    # parallel=fsdp); autocast covers what FSDP does not wrap (dp=1); fp32 master weights. fp16 would
    # need loss scaling inside the pipeline schedule's own backward, which torch's schedules do not expose.
    precisions = ("fp32", "bf16", "float8")
    precision_note = "fp16 loss scaling cannot reach into the pipeline schedule's backward; bf16 needs no scaling"
    model_parallel_dims = ("tp", "pp", "cp", "ep")
    data_parallel_dims = ("dp_replicate", "dp_shard")
    worker_modules = (*FSDPTraits.worker_modules, "framework.parallel.tied")
    # what the planner reads: gradients reduced once a step, at the last micro-batch (or pipeline backward)
    reduces_every_micro_batch = False
    machinery = 3

    @staticmethod
    def shards_units(mesh_dims: ParallelDims) -> bool:
        """FSDP2 wraps the stages only where some rank shares their gradients (data or context parallel)."""
        return mesh_dims.fsdp_size > 1

    @classmethod
    def casts_weights(cls, cfg: Config, world_size: int) -> bool:
        # Experts sharded by parallel.ep stay out of FSDP2, in fp32 under autocast: planned as all weights
        # autocast (the few others' copies counted too, a small over-estimate)
        return cls.shards_units(cls.mesh_dims(cfg, world_size)) and cfg.parallel.get("ep", 1) == 1

    @classmethod
    def auto_layouts(cls, cfg: Config, world_size: int, per_node: int) -> list[AutoLayout]:
        """Every tp (within a node) x cp (long sequences) x pp split whose pipeline divides the layers, with
        1F1B and, where the layers allow two stages a rank, Interleaved1F1B; sequence parallelism or not;
        ZeRO-3 over what is left for data parallelism."""
        spec = spec_for(cfg.model)
        if world_size == 1 or not spec.init_by_name:
            return []
        layers = spec.num_layers(cfg.model) if spec.supports_pipeline else 1
        seq_len = cfg.data.seq_len
        long = spec.context_parallel and seq_len >= LONG_SEQUENCE
        node = min(world_size, per_node)
        out = []
        for tp in _divisors(node):
            for cp in (_divisors(node // tp) if long else [1]):
                if cp > 1 and seq_len % (2 * cp):
                    continue
                for pp in _divisors(world_size // (tp * cp)):
                    if tp == pp == cp == 1 or (pp > 1 and layers % pp):
                        continue
                    dp = world_size // (tp * cp * pp)
                    schedules = [("1F1B", 1)]
                    if pp > 1 and layers % (2 * pp) == 0:
                        schedules.append(("Interleaved1F1B", 2))
                    for schedule, virtual in schedules:
                        for sp in ((False, True) if tp > 1 else (False,)):
                            for zero in ((3,) if dp * cp > 1 else (0,)):
                                parallel = (("tp", tp), ("pp", pp), ("dp_replicate", 1), ("dp_shard", dp),
                                            ("cp", cp), ("pp_schedule", schedule),
                                            ("pp_virtual_stages", virtual), ("sequence_parallel", sp))
                                out.append(AutoLayout(zero, parallel, dp))
        return out

    @classmethod
    def worker_preload(cls, cfg: Config) -> tuple[str, ...]:
        # pipelining imports dynamo (~0.6 s): only where there are stages
        return (*cls.worker_modules, *(("torch.distributed.pipelining",) if cfg.parallel.pp != 1 else ()))

    # ---- before any worker exists -------------------------------------------------------
    @classmethod
    def workers_wanted(cls, cfg: Config) -> int:
        p = cfg.parallel
        if -1 in (p.dp_replicate, p.dp_shard, p.tp, p.pp):
            return p.rest_world_size
        return ParallelDims.degrees_product(p)

    @classmethod
    def check_world(cls, cfg: Config, world_size: int) -> None:
        p = cfg.parallel
        if -1 not in (p.tp, p.pp, p.dp_replicate, p.dp_shard):
            return      # every degree fixed: ParallelDims names the product against the world size
        fixed = {dim: p[dim] for dim in ("tp", "pp", "cp", "dp_replicate", "dp_shard") if p[dim] > 1}
        need = math.prod(fixed.values())
        if world_size >= need:
            return
        names = " x ".join(f"parallel.{dim}" for dim in fixed)
        values = " x ".join(str(v) for v in fixed.values())
        on_gpus = device_type(cfg) == "cuda"
        has = (f"this node has {world_size} visible GPU{'s' if world_size != 1 else ''}" if on_gpus
               else f"the world size is {world_size}")
        shrink = " ".join(f"parallel.{dim}=1" for dim in fixed if dim in ("tp", "pp", "cp")) or \
            " ".join(f"parallel.{dim}=-1" for dim in fixed)
        raise ConfigError("parallel", f"this layout needs at least {names} = {values} = {need} "
                                      f"{'GPUs' if on_gpus else 'workers'}, but {has}; shrink it ({shrink}, or "
                                      f"parallel=fsdp on one node) or run it on {need} or more "
                                      f"{'GPUs (torchrun/srun across nodes)' if on_gpus else 'workers (launcher.nproc_per_node)'}")

    @classmethod
    def batch_layout(cls, cfg: Config, world_size: int) -> BatchLayout:
        dims = ParallelDims.from_config(cfg.parallel, world_size)
        return batch_layout(cfg, dims.dp, dims.pp)

    @classmethod
    def check(cls, cfg: Config, world_size: int) -> None:
        p, model = cfg.parallel, cfg.model
        if cfg.zero.offload_optimizer or cfg.zero.offload_params:
            raise ConfigError("zero", "parallel=3d does not offload; parallel=deepspeed offloads optimizer states "
                                      "and parameters, parallel=fsdp offloads parameters")
        if p.rest_world_size <= 0:
            raise ConfigError("parallel.rest_world_size", f"must be positive, got {p.rest_world_size}")
        check_context_parallel(cfg, p.cp, max(p.tp, 1))
        dims = ParallelDims.from_config(p, world_size)
        spec = spec_for(model)
        spec.validate_layout(cfg, dims.tp, dims.pp)
        if dims.cp > 1 and not spec.context_parallel:
            raise ConfigError("parallel.cp", f"model spec {spec.name} does not take its positions from a sequence "
                                             f"shard; context parallelism runs the llama and gpt2 families")
        if p.ep > 1 and not spec.has_experts:
            raise ConfigError("parallel.ep", f"{model._target_} has no experts to shard (model spec {spec.name}); "
                                             f"use parallel.ep=1 or an MoE model (model=moe_tiny)")
        if p.ep != 1 and p.ep != dims.dp:
            raise ConfigError("parallel.ep", f"experts shard over all data-parallel ranks or none: use parallel.ep="
                                             f"{dims.dp} (dp_replicate x dp_shard) or 1, got {p.ep}")
        if cfg.precision.name == "float8" and dims.tp > 1:
            raise ConfigError("precision", f"float8 under parallel.tp={dims.tp} is not built (torchao's float8 "
                                           f"tensor-parallel styles); use parallel.tp=1 or precision=bf16")
        if not spec.init_by_name:
            raise ConfigError("model._target_", f"parallel=3d builds the model on the meta device and fills each "
                                                f"rank's shards by parameter name; {model._target_} (model spec "
                                                f"{spec.name}) has no per-name init")
        fixed_width = [key for key, on in (("parallel.pp", dims.pp > 1), ("parallel.cp", dims.cp > 1),
                                           ("parallel.sequence_parallel", p.sequence_parallel and dims.tp > 1)) if on]
        if not cfg.data.get("packing", True) and fixed_width:
            raise ConfigError(fixed_width[0], "needs rows of one width (a pipeline's stages pass activations of the "
                                              "shape they inferred first; context and sequence parallelism split each "
                                              "row's positions evenly), and data.packing=false pads each micro-batch "
                                              "to its own longest row; set "
                                              f"{fixed_width[0]}={'false' if 'sequence' in fixed_width[0] else 1}, or "
                                              "data.packing=true where the data packs (preference pairs do not)")
        if p.sequence_parallel and cfg.data.seq_len % dims.tp:
            raise ConfigError("data.seq_len", f"sequence parallelism splits {cfg.data.seq_len} positions among "
                                              f"parallel.tp={dims.tp} ranks: not divisible")
        if dims.pp > 1:
            validate_pipeline(p.pp_schedule, dims.pp, p.pp_virtual_stages, spec.num_layers(model),
                              cls.batch_layout(cfg, world_size).pipeline_microbatches)
            split = canonical_name(p.pp_schedule) in SPLIT_BACKWARD
            # torch's eval() of these schedules still runs their split-backward actions and fails
            forward_only = [(key, why) for key, why in (
                ("trainer.eval_every", cfg.trainer.eval_every > 0),
                ("trainer.sample_every", cfg.trainer.sample_every > 0),
                ("model.balance", spec.batch_statistics(model) is not None)) if why]
            if split and forward_only:
                key = forward_only[0][0]
                what = ("aux_loss counts the experts' loads over the global batch in a forward-only pass"
                        if key == "model.balance" else "runs forward-only passes")
                raise ConfigError(key, f"{what}, which parallel.pp_schedule={p.pp_schedule} cannot run "
                                       f"(torch runs its split backward there too); use pp_schedule=1F1B, "
                                       f"Interleaved1F1B, GPipe or LoopedBFS, or "
                                       + ("model.balance=bias" if key == "model.balance" else f"{key}=0"))
            # a checkpointed region (a block, a loss chunk) is recomputed in the first half of a split backward
            # and its saved tensors are gone in the second: torch's checkpoint serves one backward
            recomputed = [key for key, on in (
                ("activation_checkpointing.mode", cfg.activation_checkpointing.mode != "none"),
                ("model.loss_chunk_tokens", bool(model.get("loss_chunk_tokens")))) if on]
            if split and recomputed:
                raise ConfigError(recomputed[0], f"recomputes in backward, and parallel.pp_schedule={p.pp_schedule} "
                                                 f"splits each backward in two (inputs, then weights), which "
                                                 f"torch's checkpoint cannot serve; use pp_schedule=1F1B, "
                                                 f"Interleaved1F1B, GPipe or LoopedBFS, or drop {recomputed[0]}")
            if split and cfg.data.get("document_mask"):
                raise ConfigError("data.document_mask", f"parallel.pp_schedule={p.pp_schedule} splits each backward "
                                                        f"in two (inputs, then weights), and torch's weight half fails "
                                                        f"on the document mask's attention (a KeyError in "
                                                        f"stage_backward_weight); use pp_schedule=1F1B, "
                                                        f"Interleaved1F1B, GPipe or LoopedBFS, or "
                                                        f"data.document_mask=false")
        if cfg.trainer.compile and dims.cp > 1:
            raise ConfigError("parallel.cp", "context parallelism's causal attention bias (a tensor subclass) does "
                                             "not pass into a compiled block yet; set trainer.compile=false or "
                                             "parallel.cp=1")
        else:
            canonical_name(p.pp_schedule)


class Parallel3DStrategy(Parallel3DTraits, UnitShardedStep, TorchStrategy):
    """The worker side of parallel=3d: the mesh, the parallelized model and its pipeline schedule."""

    def setup(self, model_factory, build_optimizer, build_scheduler) -> None:
        # FSDP2 and DTensor load here, in the worker (build_schedule imports pipelining there too)
        from framework.parallel.parallelize import parallelize
        from framework.parallel.tied import TiedAcrossStages
        cfg = self.cfg
        self.spec = model_factory.spec
        self.dims = ParallelDims.from_config(cfg.parallel, self.world_size)
        # zero=none: all data-parallel ranks replicate; the flattened data rank is the same either way.
        mesh_dims = self.mesh_dims(cfg, self.world_size)
        self.mesh = mesh_dims.build_mesh(self.device.type)
        self.pp_rank = self.mesh.pp.get_local_rank()

        if self.dims.pp > 1:
            self.stage_ids = stage_ids(self.pp_rank, self.dims.pp, cfg.parallel.pp_virtual_stages,
                                       cfg.parallel.pp_schedule)
            self.num_stages = self.dims.pp * cfg.parallel.pp_virtual_stages
        else:
            self.stage_ids, self.num_stages = [0], 1
        modules = parallelize(model_factory, self.mesh, cfg, self.device, self.sharding(mesh_dims), tuple(self.stage_ids),
                              self.num_stages)
        self.mesh_dims_built = mesh_dims
        self.context = None
        if self.dims.cp > 1:
            from framework.parallel.context_parallel import ContextParallel
            self.context = ContextParallel(self.mesh.cp.get_group(), cfg.data.seq_len)
        self.stages = modules
        self.model = modules[0] if len(modules) == 1 else nn.ModuleList(modules)
        self.stage_group = self.mesh.pp.get_group() if self.dims.pp > 1 else None
        tied = self.spec.tied_parameters(cfg.model) if self.num_stages > 1 else ()
        self.tied = TiedAcrossStages(modules, tied, self.stage_group, self.device) if tied else None

        self.schedule = self._forward_schedule = None
        if self.dims.pp > 1:
            self._build_schedule(self.batch_layout(cfg, self.world_size).pipeline_microbatches)
        self.optimizer = self.make_optimizer(self.model, build_optimizer)
        self.scheduler = build_scheduler(self.optimizer)

    def build_reference(self, model_factory) -> None:
        """The initial model split, tensor-parallel and sharded as the policy is. One stage only: pipelines are
        refused with one sequence a row (check), the only rows preference data has."""
        from framework.parallel.parallelize import parallelize
        if len(self.stages) != 1:
            raise NotImplementedError("a frozen reference model across pipeline stages")
        reference, = parallelize(model_factory, self.mesh, self.cfg, self.device, self.sharding(self.mesh_dims_built),
                                 tuple(self.stage_ids), self.num_stages)
        self.reference_model = frozen(reference)

    def _new_schedule(self):
        return build_schedule(self.cfg.parallel.pp_schedule, self.stages, self.stage_ids, self.num_stages,
                              self.schedule_microbatches, lambda output, target: self._loss_fn(output, target),
                              self.mesh.pp.get_group(), self.device, documents=self.cfg.data.document_mask)

    def _build_schedule(self, microbatches: int) -> None:
        # a second schedule over the same modules runs the forwards without gradient (evaluation, batch
        # statistics), made when first needed: torch's schedule infers its shapes again whenever it switches
        self.schedule_microbatches = microbatches
        self.schedule = self._new_schedule()
        self._forward_schedule = None

    def plan_batches(self, layout: BatchLayout) -> None:
        """A pipeline's schedule runs a fixed number of micro-batches: a new number gets a new schedule."""
        if self.schedule is not None and layout.pipeline_microbatches != self.schedule_microbatches:
            self._build_schedule(layout.pipeline_microbatches)

    def sharding(self, mesh_dims: ParallelDims) -> ShardingPlan:
        """FSDP2 over the data-parallel dims, with the same mixed-precision policy as parallel=fsdp."""
        from framework.parallel.fsdp import mixed_precision_policy
        from framework.parallel.parallelize import ShardingPlan
        cfg = self.cfg
        return ShardingPlan(enabled=self.shards_units(mesh_dims),
                            reshard_after_forward=not self.keeps_gathered(cfg.zero.stage),
                            mp_policy=mixed_precision_policy(cfg.precision), wrap_classes=cfg.parallel.wrap_classes)

    def clip_grad_norm(self, max_grad_norm: float) -> torch.Tensor:
        counted = None if self.tied is None else list(self.tied.counted())
        from framework.parallel.grad_norm import clip_grad_norm_
        return clip_grad_norm_(self.model.parameters(), max_grad_norm, self.device, self.stage_group, counted)

    def teardown(self) -> None:
        # Stages and schedule hold the FSDP/pipeline state; free them before the process groups go.
        self.stages = self.schedule = self._forward_schedule = None
        super().teardown()

    # ---- data ---------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        return self.mesh.dp.get_local_rank()

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def holds_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def holds_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    @property
    def needs_batches(self) -> bool:
        return self.holds_first or self.holds_last

    def unwrapped_model(self) -> nn.Module:
        return self.stages[0]

    def checkpoint_model(self) -> nn.Module:
        return self.stages[0] if len(self.stages) == 1 else self.spec.merge_stages(self.stages)

    # ---- step ---------------------------------------------------------------------------
    def accumulation_context(self, is_last: bool):
        if hasattr(self.model, "set_requires_gradient_sync"):
            self.model.set_requires_gradient_sync(is_last)
        return contextlib.nullcontext()

    def sequence_step(self):
        """What a step's forward and backward run inside: context parallelism's attention and positions."""
        return self.context.step() if self.context is not None else contextlib.nullcontext()

    def _to_device(self, batch):
        batch = tuple(super()._to_device(batch))
        return self.context.shard_batch(*batch) if self.context is not None else batch

    def forward_backward(self, micro_batches, loss_fn) -> torch.Tensor:
        self.gather_batch_statistics(micro_batches, loss_fn)
        with self.sequence_step():
            if self.schedule is None:
                return self.accumulate(micro_batches, loss_fn)
            self.model.train()
            return self._run_pipeline(micro_batches, loss_fn, train=True)

    @torch.no_grad()
    def eval_loss(self, micro_batches, loss_fn) -> torch.Tensor:
        with self.sequence_step():
            if self.schedule is None:
                return super().eval_loss(micro_batches, loss_fn)
            self.model.eval()
            return self._run_pipeline(micro_batches, loss_fn, train=False)

    def _run_pipeline(self, micro_batches, loss_fn, train: bool) -> torch.Tensor:
        """One pass of this rank's share through the pipeline; the mean loss, on every rank."""
        self._loss_fn = loss_fn
        args, kwargs, losses = (), {}, []
        if micro_batches:
            inputs, targets, *documents = self._to_device([torch.cat(parts) for parts in zip(*micro_batches)])
            if self.holds_first:
                args = (inputs, *documents)
            if self.holds_last:
                kwargs = {"target": targets, "losses": losses}
        with self.autocast():
            if train:
                self.schedule.step(*args, return_outputs=False, **kwargs)
            else:
                if self._forward_schedule is None:
                    self._forward_schedule = self._new_schedule()
                self._forward_schedule.eval(*args, **kwargs)
        if train and self.tied is not None:
            self.tied.sum_grads()
        local = torch.stack(losses).float().mean() if losses else torch.zeros((), device=self.device)
        # The last stage's (dp x cp x tp) ranks hold the loss (tp ranks alike, cp ranks an equal share of
        # each sequence's tokens): their mean is the global mean.
        total = local.detach().clone()
        dist.all_reduce(total)
        return total / (self.dims.dp * self.dims.cp * self.dims.tp)
