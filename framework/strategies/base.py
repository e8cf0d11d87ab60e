"""The Strategy interface: everything the trainer needs that depends on how the job is parallelised.

The trainer calls only these methods. Class-level hooks (`workers_wanted`, `validate`)
run in the launching process before any worker or process group exists.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from framework.config.schema import LoraConfig, ParallelConfig
from framework.errors import ConfigError
from framework.metrics.memory import local_bytes
from framework.models.loss import weighted_micro_batch
from framework.parallel.activation_checkpointing import validate_activation_checkpointing
from framework.parallel.batch_layout import BatchLayout, batch_layout
from framework.parallel.build_order import checkpoint_compile_wrap
from framework.parallel.compile import BACKENDS
from framework.parallel.float8 import convert_float8
from framework.parallel.mesh import ParallelDims
from framework.parallel.precision import build_precision, validate_precision
from framework.parallel.process_group import init_default_group
from framework.runtime.devices import join_one_process_world, prepare_worker, process_group_backend

if TYPE_CHECKING:
    from framework.models.factory import ModelFactory

#: the degrees of parallel.* (framework.parallel.mesh.DIMS, by kind)
DATA_PARALLEL_DIMS = ("dp_replicate", "dp_shard")
MODEL_PARALLEL_DIMS = ("tp", "pp", "cp", "ep")
ZERO_NAMES = {0: "none", 1: "stage1", 2: "stage2", 3: "stage3"}
#: the one vocabulary (docs/design/index.md): what each zero stage keeps one shard of per data-parallel rank
ZERO_SHARDS: dict[int, frozenset[str]] = {0: frozenset(), 1: frozenset({"optimizer"}),
                                          2: frozenset({"optimizer", "grads"}),
                                          3: frozenset({"optimizer", "grads", "params"})}


class AutoLayout(NamedTuple):
    """One layout parallel=auto tries for a strategy (the planner adds activation checkpointing and
    micro-batch sizes to each)."""
    zero: int
    parallel: tuple = ()        # (key, value) pairs for parallel.*
    dp: int = 1                 # data-parallel ranks a global batch splits over
    offload: bool = False       # zero.offload_optimizer


class Strategy:
    name = "base"
    checkpoint_format = "none"   #: what save_checkpoint writes; a checkpoint loads only into the same format
    deterministic_refusal: str | None = None   #: why trainer.deterministic=true cannot hold here (None: it can)
    options = ParallelConfig  #: the schema of parallel.* for this strategy
    #: zero stage -> None if supported, else the strategies that support it (for the error message)
    zero_support: dict[int, str | None] = {0: None}
    precisions: tuple[str, ...] = ("fp32",)
    activation_checkpointing: tuple[str, ...] = ("none",)
    #: wrappers and meshes need a process group, even for a world of one (one worker on one GPU)
    needs_process_group = True
    #: what this strategy's workers import when they set up, clip and checkpoint (see worker_preload)
    worker_modules: tuple[str, ...] = ()
    #: lora.base_dtype values whose frozen weights it can hold (empty: it trains no adapters, lora.enabled refused)
    adapter_base_dtypes: tuple[str, ...] = ()

    # ---- before any worker exists -------------------------------------------------------
    #: workers spawned when neither torchrun nor launcher.nproc_per_node says how many
    default_workers = 1

    @classmethod
    def workers_wanted(cls, cfg) -> int:
        return cls.default_workers

    @classmethod
    def check_world(cls, cfg, world_size: int) -> None:
        """Before anything divides the world: refuse a world too small for the layout, saying how to shrink it."""

    @classmethod
    def batch_layout(cls, cfg, world_size: int) -> BatchLayout:
        """How a global batch splits over this strategy's ranks (every rank a data-parallel one here);
        ConfigError where the batch rule does not hold."""
        return batch_layout(cfg, dp=world_size)

    #: parallel dims beyond data parallelism that this strategy has (the others must stay 1)
    model_parallel_dims: tuple[str, ...] = ()
    #: data-parallel degrees it takes from parallel.* (none: every rank is a data-parallel one)
    data_parallel_dims: tuple[str, ...] = ()
    #: why a precision is missing from `precisions`, added to the error
    precision_note = ""
    #: why trainer.compile cannot work under this strategy ("" = it can)
    compile_note = ""
    #: why this strategy cannot change a step's micro-batches mid-run, for trainer.on_oom=retry and
    #: trainer.rampup_batch_size ("" = it can: plan_batches)
    batch_change_note = ""

    # ---- what the planner reads (framework/plan asks these, never a strategy's name) ------------
    #: how the data-parallel ranks hold the model states: "replicate" (each a whole copy, gradients
    #: all-reduced in buckets; a zero stage partitions the optimizer by whole parameters, as torch's
    #: ZeroRedundancyOptimizer does), "unit" (FSDP2: each unit - a block, the root - sharded on dim 0 over
    #: dp_shard x cp and gathered whole while it runs; the mesh dims name the collectives) or "flat"
    #: (DeepSpeed ZeRO: each parameter group flattened and partitioned evenly, `flat_sizes` its buckets)
    dp_sharding = "replicate"
    #: zero stage -> what this strategy's mechanism keeps one shard of where it differs from ZERO_SHARDS
    #: (FSDP2 keeps parameters sharded between steps at stage2 too); read through `shards`
    zero_shards: dict[int, frozenset[str]] = {}
    #: gradients are reduced after every micro-batch's backward (False: once a step, at the last one)
    reduces_every_micro_batch = False
    #: parallel=auto's "less machinery" order: of layouts it cannot tell apart, the lowest runs
    machinery = 0

    @classmethod
    def accepted_zero_stages(cls) -> tuple[int, ...]:
        """The zero stages `validate` lets through (zero_support says why the others are refused)."""
        return tuple(stage for stage, refused in sorted(cls.zero_support.items()) if refused is None)

    @classmethod
    def shards(cls, stage: int) -> frozenset[str]:
        """What zero=stage{stage} keeps one shard of per rank: "optimizer", "grads", "params"."""
        return cls.zero_shards.get(stage, ZERO_SHARDS[stage])

    @classmethod
    def keeps_gathered(cls, stage: int) -> bool:
        """Whether a unit's gathered parameters stay from its forward to its backward at this zero stage (so
        every unit is whole at once when backward starts), rather than being freed after each forward."""
        return False

    @classmethod
    def mesh_dims(cls, cfg, world_size: int) -> ParallelDims:
        """The degrees model states and batches follow on `world_size` ranks: every rank a data-parallel
        replica here."""
        return ParallelDims(pp=1, dp_replicate=world_size, dp_shard=1, cp=1, tp=1)

    @classmethod
    def gradient_copy(cls, cfg) -> bool:
        """Whether it keeps a second, whole copy of the gradients (DDP's buckets)."""
        return False

    #: whether the forward runs under torch.autocast (False where the wrapper casts parameters itself:
    #: FSDP2's MixedPrecisionPolicy, DeepSpeed's bf16 engine)
    precision_autocast = False

    @classmethod
    def casts_weights(cls, cfg, world_size: int) -> bool:
        """Whether the blocks run on weights the wrapper has already cast to precision.param_dtype (FSDP2's
        mixed-precision policy, DeepSpeed's bf16 module) rather than on fp32 weights under autocast: then
        autocast keeps no low-precision copies of them, and the residual stream is in that dtype too."""
        return False

    @classmethod
    def flat_sizes(cls, cfg) -> dict[str, int]:
        """dp_sharding="flat": elements of its gradient reduce bucket ("reduce_bucket"), of stage 3's
        parameter prefetch bucket ("prefetch_bucket"), and the size below which a stage-3 parameter stays
        whole on every rank ("persistence_threshold")."""
        return {}

    @classmethod
    def auto_layouts(cls, cfg, world_size: int, per_node: int) -> list[AutoLayout]:
        """The layouts parallel=auto tries for this strategy on `world_size` ranks (`per_node` a node),
        in the order ties keep."""
        return []

    @classmethod
    def worker_preload(cls, cfg) -> tuple[str, ...]:
        """The modules this strategy's workers import, which the launcher's fork server imports once for all
        of them (see fork_server_preload). Nothing here may touch CUDA: a child forked after that cannot use it."""
        return cls.worker_modules

    @classmethod
    def fork_server_preload(cls, cfg) -> tuple[str, ...]:
        """What the launcher's fork server imports once for all of this job's workers, which otherwise each
        import it again after the fork (0.5-1.5 s of CPU a worker for DeepSpeed, pipelining, a transformers
        architecture, float8 or compile: 8 workers on 2 cores start seconds later): the strategy's modules,
        and on CPU also the strategy's and the model spec's own modules and what the model, float8 and compile
        import (on a GPU those are left to the workers: their imports are not known never to ask CUDA)."""
        from framework.models.spec import spec_for
        from framework.parallel import compile as compiling, float8
        from framework.runtime.devices import device_type
        if device_type(cfg) != "cpu":
            return cls.worker_preload(cfg)
        spec = spec_for(cfg.model)
        return (*cls.worker_preload(cfg), cls.__module__, type(spec).__module__, *spec.worker_modules(cfg.model),
                *float8.worker_modules(cfg.precision), *compiling.worker_modules(cfg.trainer))

    @classmethod
    def adopt_user_files(cls, cfg, world_size: int, explicit: set[str]) -> None:
        """Before validation: let files the user brings (DeepSpeed's JSON) set what the user left at our
        defaults (`explicit`: the keys chosen on the command line or by a recipe)."""

    @classmethod
    def validate(cls, cfg, world_size: int) -> None:
        """The template every strategy runs: the shared capability checks, always, then its own `check`."""
        stage = cfg.zero.stage
        if stage not in cls.zero_support:
            raise ConfigError("zero", f"parallel={cls.name} does not do zero={ZERO_NAMES.get(stage, stage)}")
        if cls.zero_support[stage] is not None:
            raise ConfigError("zero", f"parallel={cls.name} does not do zero={ZERO_NAMES[stage]}; "
                                      f"{cls.zero_support[stage]}")
        validate_precision(cfg)
        if cfg.precision.name not in cls.precisions:
            note = f": {cls.precision_note}" if cls.precision_note else ""
            raise ConfigError("precision", f"parallel={cls.name} does not support precision={cfg.precision.name}; "
                                           f"it supports {', '.join(cls.precisions)}{note}")
        validate_activation_checkpointing(cfg)
        if cfg.activation_checkpointing.mode not in cls.activation_checkpointing:
            raise ConfigError("activation_checkpointing",
                              f"parallel={cls.name} does not support activation_checkpointing="
                              f"{cfg.activation_checkpointing.mode} yet")
        if cfg.trainer.compile and cls.compile_note:
            raise ConfigError("trainer.compile", f"parallel={cls.name} cannot use trainer.compile: {cls.compile_note}")
        if cfg.trainer.compile and cfg.data.get("document_mask"):
            raise ConfigError("data.document_mask", "packed documents' attention mask (flex_attention's BlockMask) "
                                                    "does not pass into a compiled block yet; set trainer.compile="
                                                    "false or data.document_mask=false")
        if not cfg.trainer.compile and cfg.trainer.compile_backend != BACKENDS[0]:
            raise ConfigError("trainer.compile_backend", "applies to trainer.compile=true; set it, or drop "
                                                         "trainer.compile_backend")
        cls.refuse_unused_parallel_options(cfg.parallel)
        cls.check_adapters(cfg)
        cls.check(cfg, world_size)

    @classmethod
    def refuse_unused_parallel_options(cls, p) -> None:
        """A degree, pipeline or sequence-parallel setting this strategy would not read is refused, never
        silently ignored (parallel.* is shared by every strategy's schema)."""
        from framework.strategies.registry import all_strategy_classes
        defaults = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}
        dims = (*cls.data_parallel_dims, *cls.model_parallel_dims)
        for key in (*DATA_PARALLEL_DIMS, *MODEL_PARALLEL_DIMS):
            if key not in dims and p[key] != defaults[key]:
                having = [n for n, c in all_strategy_classes().items() if key in (*c.data_parallel_dims,
                                                                                  *c.model_parallel_dims)]
                every = " (every rank is a data-parallel one)" if key in DATA_PARALLEL_DIMS else ""
                # a model-parallel degree alone, as a command: the other model-parallel degrees before it at 1
                alone = " ".join(f"parallel.{d}=1" for d in MODEL_PARALLEL_DIMS[:MODEL_PARALLEL_DIMS.index(key)]) \
                    if key in MODEL_PARALLEL_DIMS else ""
                example = f" (parallel={having[-1]} {alone} parallel.{key}={p[key]})" if alone else ""
                raise ConfigError(f"parallel.{key}", f"parallel={cls.name} has no {key} dimension{every}, got "
                                                      f"{p[key]}; parallel={' or '.join(having)} does{example}")
        if p.pp == 1:
            for key in ("pp_schedule", "pp_virtual_stages", "pp_microbatches"):
                if p[key] != defaults[key]:
                    raise ConfigError(f"parallel.{key}", f"applies to a pipeline, and parallel.pp=1 has none; "
                                                          f"set parallel.pp (parallel=3d) or drop parallel.{key}")
        if p.sequence_parallel and p.tp == 1:
            raise ConfigError("parallel.sequence_parallel", "splits the sequence among tensor-parallel ranks, and "
                                                            "parallel.tp=1 has none; set parallel.tp (parallel=3d)")

    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        """Rules this strategy adds on top of the shared ones; raise ConfigError."""

    @classmethod
    def check_adapters(cls, cfg) -> None:
        """lora.enabled: whether this strategy trains adapters, on frozen weights of lora.base_dtype; without it
        no other lora key may differ from its default (it would be silently ignored)."""
        if not cfg.lora.enabled:
            for f in dataclasses.fields(LoraConfig):
                if f.name != "enabled" and cfg.lora[f.name] != (f.default_factory() if f.default_factory
                                                                 is not dataclasses.MISSING else f.default):
                    raise ConfigError(f"lora.{f.name}", f"applies to adapters, and lora.enabled=false trains none; "
                                                        f"set lora.enabled=true or drop lora.{f.name}")
            return
        from framework.strategies.registry import all_strategy_classes
        if not cls.adapter_base_dtypes:
            serving = [name for name, c in all_strategy_classes().items() if c.adapter_base_dtypes]
            raise ConfigError("lora.enabled", f"parallel={cls.name} does not train adapters yet; use parallel="
                                              f"{', '.join(serving)}")
        if cfg.lora.base_dtype not in cls.adapter_base_dtypes:
            raise ConfigError("lora.base_dtype", f"parallel={cls.name} holds frozen weights in "
                                                 f"{', '.join(cls.adapter_base_dtypes)}, not {cfg.lora.base_dtype}; "
                                                 f"use one of those, or parallel=single or ddp")

    # ---- inside a worker ----------------------------------------------------------------
    def __init__(self, cfg):
        self.cfg = cfg
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.device = self._pick_device()
        self._grad_bytes = 0
        self._host_group = None

    def _pick_device(self) -> torch.device:
        want = self.cfg.device
        if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def setup_distributed(self) -> None:
        prepare_worker(self.cfg, self.device)
        if self.needs_process_group:
            join_one_process_world()
        if "WORLD_SIZE" in os.environ and not dist.is_initialized():
            init_default_group(process_group_backend(self.cfg, self.device), self.device, self.cfg.launcher.timeout_s)

    @property
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def is_main(self) -> bool:
        """The one rank that logs and writes shared files."""
        return self.rank == 0

    def setup(self, build_model: "ModelFactory",
              build_optimizer: Callable[[Iterable], torch.optim.Optimizer],
              build_scheduler: Callable[[torch.optim.Optimizer], object]) -> None:
        raise NotImplementedError

    def forward_backward(self, micro_batches, loss_fn) -> torch.Tensor:
        """Run all micro-batches of this rank's share of one global batch, accumulate the gradient
        of the global-batch mean loss, and return that mean loss (a 0-d tensor, same on every rank).
        Nothing here may wait for the device: the trainer reads the loss only on the steps it logs."""
        raise NotImplementedError

    def optimizer_step(self, max_grad_norm: float) -> torch.Tensor:
        """Clip (0 = measure only), step optimizer and LR schedule, zero gradients; return the grad norm
        as a 0-d tensor (read only on logged steps)."""
        raise NotImplementedError

    def plan_batches(self, layout: BatchLayout) -> None:
        """Before a step whose batch layout differs from the previous step's (a step of a batch-size ramp,
        micro-batches halved after an out-of-memory error). Here nothing: forward_backward takes whatever
        micro-batches it is handed."""

    def drop_step(self) -> None:
        """Forget a step that failed part-way (out of memory): its gradients, and the memory the CUDA
        allocator keeps cached, so that the step can run again with smaller micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def first_report(self, report: str | None) -> str | None:
        """The report of the lowest rank that has one (None: no rank has); every rank calls it. Agreed among
        the hosts over gloo, so that no rank waits for its device: one flag, and the reports only where one is."""
        if not dist.is_initialized():
            return report
        if self._host_group is None:
            self._host_group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        vote = torch.tensor([int(report is not None)])
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._host_group)
        if not vote.item():
            return None
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report, group=self._host_group)
        return next(r for r in reports if r is not None)

    @torch.no_grad()
    def eval_loss(self, micro_batches, loss_fn) -> torch.Tensor:
        raise NotImplementedError

    def gather_batch_statistics(self, micro_batches, loss_fn) -> None:
        """Where the model's training loss reads statistics of the whole global batch (the spec's
        batch_statistics: MoE's balance loss), a forward of each micro-batch without gradient gathers them
        first; a step that is one forward in the world is its own global batch. Every rank calls this at
        the start of forward_backward."""
        from framework.models.spec import spec_for
        if not hasattr(self, "_batch_statistics"):
            self._batch_statistics = spec_for(self.cfg.model).batch_statistics(self.cfg.model)
        if self._batch_statistics is None or (self.world_size == 1 and len(micro_batches) <= 1):
            return
        with self._batch_statistics.gathering(self.device):
            self.eval_loss(micro_batches, loss_fn)

    @property
    def needs_batches(self) -> bool:
        """False on ranks that take no token batches (inner pipeline stages)."""
        return True

    # ---- checkpoints (all ranks call these; `path` is one step's directory) ---------------
    def save_checkpoint(self, path: str) -> None:
        """Model, optimizer, LR schedule and precision state of this strategy."""
        raise NotImplementedError(f"parallel={self.name} cannot save checkpoints yet")

    def load_checkpoint(self, path: str) -> None:
        raise NotImplementedError(f"parallel={self.name} cannot load checkpoints yet")

    supports_async_save = False
    #: saves to and loads from an object store URL (checkpoint.dir=s3://...), not only a file system path
    saves_to_urls = False

    def save_checkpoint_async(self, path: str):
        """Start saving; return a Future whose result() means the state is on disk."""
        raise NotImplementedError(f"parallel={self.name} cannot save in the background")

    def discard_gradients(self) -> None:
        raise NotImplementedError(f"parallel={self.name} cannot skip a step")

    def step_metrics(self) -> dict:
        """Extra numbers for the metrics record of the last step (e.g. loss scale, skipped steps)."""
        return {}

    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def unwrapped_model(self) -> nn.Module:
        return self.model

    def memory_breakdown(self) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer states that this rank actually holds."""
        params = list(self.model.parameters())
        state = [t for s in self.optimizer_states() for t in s.values() if isinstance(t, torch.Tensor)]
        return {
            "param_bytes": sum(local_bytes(p) for p in params),
            "grad_bytes": self._grad_bytes,
            "optim_state_bytes": sum(local_bytes(t) for t in state),
        }

    def optimizer_states(self):
        return self.optimizer.state.values()

    def reduce_mean(self, value: torch.Tensor, group=None) -> torch.Tensor:
        if not dist.is_initialized():
            return value
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
        return value / dist.get_world_size(group)

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def teardown(self) -> None:
        # Wrappers such as DDP's Reducer hold the process group. Freed after it is destroyed, they
        # would run the gloo destructor, which joins its threads while holding the GIL: a deadlock.
        if dist.is_initialized():
            dist.barrier()
        self.model = self.optimizer = self.scheduler = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()


class TorchStrategy(Strategy):
    """Shared loop body for strategies whose model is a torch nn.Module driven by a torch optimizer."""
    precision_autocast = True
    checkpoint_format = "dcp"
    supports_async_save = True
    saves_to_urls = True
    worker_modules = ("framework.checkpoint.dcp_state", "framework.parallel.grad_norm")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.precision = build_precision(cfg, self.device, autocast=self.precision_autocast)
        self._async_group = None
        self._stager = None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def make_optimizer(self, params, build_optimizer):
        return build_optimizer(params)

    def accumulation_context(self, is_last: bool):
        """Skip gradient synchronisation on all but the last micro-batch where the wrapper allows it."""
        return contextlib.nullcontext()

    def autocast(self):
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def setup(self, model_factory, build_optimizer, build_scheduler) -> None:
        model = model_factory().to(self.device)
        convert_float8(model, self.cfg.precision, model_factory.spec, fsdp=False)
        self.model = checkpoint_compile_wrap(model, self.cfg, model_factory.spec, self.wrap_model)
        self.optimizer = self.make_optimizer(self.model.parameters(), build_optimizer)
        self.scheduler = build_scheduler(self.optimizer)

    def step_metrics(self) -> dict:
        return self.precision.metrics()

    def discard_gradients(self) -> None:
        """Skip this step's update (a non-finite loss under trainer.on_nonfinite=skip); the LR schedule
        still advances so it stays aligned with the step count."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def checkpoint_optimizer(self):
        """The optimizer whose state is saved: the one holding this rank's states."""
        return self.optimizer

    def checkpoint_model(self) -> nn.Module:
        """The module whose parameter names are the full model's (wrappers are seen through by DCP)."""
        return self.model

    def save_checkpoint(self, path: str) -> None:
        from framework.checkpoint import dcp_state
        dcp_state.save(path, self.checkpoint_model(), self.checkpoint_optimizer(), self.scheduler, self.precision)

    def save_checkpoint_async(self, path: str):
        # The background writer gets a process group of its own, so its collectives never
        # interleave with the training step's on the default group.
        from framework.checkpoint import dcp_state
        from framework.checkpoint.staging import ReusedStager
        if dist.is_initialized() and self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")
        if self._stager is None:
            self._stager = ReusedStager(self.device)
        return dcp_state.save(path, self.checkpoint_model(), self.checkpoint_optimizer(), self.scheduler,
                              self.precision, background=True, group=self._async_group, stager=self._stager)

    def teardown(self) -> None:
        if self._stager is not None:
            self._stager.release()
            self._stager = None
        super().teardown()

    def load_checkpoint(self, path: str) -> None:
        from framework.checkpoint import dcp_state
        dcp_state.load(path, self.checkpoint_model(), self.checkpoint_optimizer(), self.scheduler, self.precision)

    def _to_device(self, batch):
        return (t.to(self.device, non_blocking=True) for t in batch)

    def forward_backward(self, micro_batches, loss_fn) -> torch.Tensor:
        self.gather_batch_statistics(micro_batches, loss_fn)
        return self.accumulate(micro_batches, loss_fn)

    def accumulate(self, micro_batches, loss_fn) -> torch.Tensor:
        """Forward and backward of each micro-batch in turn, the gradient accumulated."""
        self.model.train()
        n = len(micro_batches)
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            inputs, targets, *documents = self._to_device(batch)
            with self.accumulation_context(is_last=i == n - 1), weighted_micro_batch(1 / n):
                with self.autocast():
                    loss = loss_fn(self.model(inputs, *documents), targets)
                self.backward(loss / n)
            total += loss.detach().float()
        return self.reduce_mean(total / n)

    #: the process group over which pipeline stages sum their gradient norms (None: no pipeline)
    stage_group = None

    def clip_grad_norm(self, max_grad_norm: float) -> torch.Tensor:
        from framework.parallel.grad_norm import clip_grad_norm_     # DTensor: in the worker only
        return clip_grad_norm_(self.model.parameters(), max_grad_norm, self.device, self.stage_group)

    def optimizer_step(self, max_grad_norm: float) -> torch.Tensor:
        self.precision.unscale_(self.optimizer)
        grad_norm = self.clip_grad_norm(max_grad_norm)
        self._grad_bytes = sum(local_bytes(p.grad) for p in self.model.parameters() if p.grad is not None)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm

    @torch.no_grad()
    def eval_loss(self, micro_batches, loss_fn) -> torch.Tensor:
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for batch in micro_batches:
            inputs, targets, *documents = self._to_device(batch)
            with self.autocast():
                total += loss_fn(self.model(inputs, *documents), targets).float()
        return self.reduce_mean(total / max(1, len(micro_batches)))
