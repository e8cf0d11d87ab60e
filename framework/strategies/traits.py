"""What a strategy declares at class level, read in the launching process before any worker or process group
exists: its capabilities (zero stages, precisions, activation checkpointing, adapters), its degrees, the batch
layout, what the planner reads (how it shards and keeps model states, its mesh, the layouts parallel=auto tries)
and `validate`, the template of checks every strategy runs. The worker-side interface is runtime.py; a strategy's
one file holds its traits class (a subclass of this) and its runtime class (a subclass of that and of runtime.py's
Strategy). The registry gives framework/plan, admission and validation the traits class only
(registry.strategy_class), the worker the runtime class (registry.strategy_runtime)."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from framework.config.schema import Config, LoraConfig, ParallelConfig
from framework.errors import ConfigError
from framework.parallel.activation_checkpointing import validate_activation_checkpointing
from framework.parallel.batch_layout import BatchLayout, batch_layout
from framework.parallel.compile import BACKENDS
from framework.parallel.mesh import ParallelDims
from framework.parallel.precision import validate_precision

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


class StrategyTraits:
    name = "base"
    checkpoint_format = "none"   #: what save_checkpoint writes; a checkpoint loads only into the same format
    deterministic_refusal: str | None = None   #: why trainer.deterministic=true cannot hold here (None: it can)
    options = ParallelConfig  #: the schema of parallel.* for this strategy
    #: zero stage -> None if supported, else the strategies that support it (for the error message)
    zero_support: dict[int, str | None] = {0: None}
    precisions: tuple[str, ...] = ("fp32",)
    #: precision.store_dtype values whose parameters it trains (store_dtype_note: why one is missing)
    store_dtypes: tuple[str, ...] = ("float32",)
    store_dtype_note = ""
    activation_checkpointing: tuple[str, ...] = ("none",)
    #: wrappers and meshes need a process group, even for a world of one (one worker on one GPU)
    needs_process_group = True
    #: what this strategy's workers import when they set up, clip and checkpoint (see worker_preload)
    worker_modules: tuple[str, ...] = ()
    #: lora.base_dtype values whose frozen weights it can hold (empty: it trains no adapters, lora.enabled refused)
    adapter_base_dtypes: tuple[str, ...] = ()
    #: its optimizer steps flattened partitions of many parameters (ZeRO), not the parameters' own tensors
    flat_optimizer_partitions = False
    #: it builds a frozen copy of the initial model, laid out like the policy (`build_reference`), for an
    #: objective that reads a reference model without LoRA (objective=dpo); False: such a job is refused
    frozen_reference = False

    # ---- before any worker exists -------------------------------------------------------
    #: workers spawned when neither torchrun nor launcher.nproc_per_node says how many
    default_workers = 1

    @classmethod
    def workers_wanted(cls, cfg: Config) -> int:
        return cls.default_workers

    @classmethod
    def check_world(cls, cfg: Config, world_size: int) -> None:
        """Before anything divides the world: refuse a world too small for the layout, saying how to shrink it."""

    @classmethod
    def batch_layout(cls, cfg: Config, world_size: int) -> BatchLayout:
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
    def mesh_dims(cls, cfg: Config, world_size: int) -> ParallelDims:
        """The degrees model states and batches follow on `world_size` ranks: every rank a data-parallel
        replica here."""
        return ParallelDims(pp=1, dp_replicate=world_size, dp_shard=1, cp=1, tp=1)

    @classmethod
    def gradient_copy(cls, cfg: Config) -> bool:
        """Whether it keeps a second, whole copy of the gradients (DDP's buckets)."""
        return False

    #: whether the forward runs under torch.autocast (False where the wrapper casts parameters itself:
    #: FSDP2's MixedPrecisionPolicy, DeepSpeed's bf16 engine)
    precision_autocast = False

    @classmethod
    def casts_weights(cls, cfg: Config, world_size: int) -> bool:
        """Whether the blocks run on weights the wrapper has already cast to precision.param_dtype (FSDP2's
        mixed-precision policy, DeepSpeed's bf16 module) rather than on fp32 weights under autocast: then
        autocast keeps no low-precision copies of them, and the residual stream is in that dtype too."""
        return False

    @classmethod
    def flat_sizes(cls, cfg: Config) -> dict[str, int]:
        """dp_sharding="flat": elements of its gradient reduce bucket ("reduce_bucket"), of stage 3's
        parameter prefetch bucket ("prefetch_bucket"), and the size below which a stage-3 parameter stays
        whole on every rank ("persistence_threshold")."""
        return {}

    @classmethod
    def auto_layouts(cls, cfg: Config, world_size: int, per_node: int) -> list[AutoLayout]:
        """The layouts parallel=auto tries for this strategy on `world_size` ranks (`per_node` a node),
        in the order ties keep."""
        return []

    @classmethod
    def worker_preload(cls, cfg: Config) -> tuple[str, ...]:
        """The modules this strategy's workers import, which the launcher's fork server imports once for all
        of them (framework/launch/preload.py). Nothing here may touch CUDA: a child forked after that cannot use it."""
        return cls.worker_modules

    @classmethod
    def adopt_user_files(cls, cfg: Config, world_size: int, explicit: set[str]) -> None:
        """Before validation: let files the user brings (DeepSpeed's JSON) set what the user left at our
        defaults (`explicit`: the keys chosen on the command line or by a recipe)."""

    @classmethod
    def validate(cls, cfg: Config, world_size: int) -> None:
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
        if cfg.precision.get("store_dtype") not in (None, *cls.store_dtypes):
            raise ConfigError("precision.store_dtype", f"parallel={cls.name} keeps parameters in "
                                                       f"{', '.join(cls.store_dtypes)}: {cls.store_dtype_note}")
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
    def check(cls, cfg: Config, world_size: int) -> None:
        """Rules this strategy adds on top of the shared ones; raise ConfigError."""

    @classmethod
    def check_adapters(cls, cfg: Config) -> None:
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

    # ---- checkpoints
    #: save_checkpoint_async works (checkpoint.async_save)
    supports_async_save = False
    #: saves to and loads from an object store URL (checkpoint.dir=s3://...), not only a file system path
    saves_to_urls = False
