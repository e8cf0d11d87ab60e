"""Typed schemas for every config group.

Each group option in conf/ starts its defaults list with `<option>_schema`, so a key the
schema does not know, or a value of the wrong type, fails when Hydra composes the config.
Strategy-specific options live beside their strategy; only the shared parts are here.

A field that takes one of a fixed set of values is `OneOf[...]`: OmegaConf 2.3 refuses typing.Literal in
a structured config, so the type it sees is str and the set rides along as a Literal, which
config/choices.py reads to refuse any other value before work starts. Where the set is a table of the
code that implements it (sources, schedules, dtypes), the field names that table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from omegaconf import MISSING

from framework.axes import crossed

from framework.data.sources import SOURCES, TOKEN_DTYPES
from framework.optim.schedulers import SCHEDULES
from framework.parallel.activation_checkpointing import MODES as AC_MODES
from framework.parallel.compile import BACKENDS as COMPILE_BACKENDS
from framework.parallel.pipeline import SCHEDULES as PP_SCHEDULES
from framework.precision import COMPUTE_DTYPES, DTYPES, FLOAT8_RECIPES


class OneOf:
    """`OneOf["a", "b"]` (or `OneOf[a_tuple]`) = Annotated[str, Literal["a", "b"]]."""

    def __class_getitem__(cls, values):
        return Annotated[str, Literal[tuple(values) if isinstance(values, (tuple, list, dict)) else (values,)]]


@dataclass
class ParallelConfig:
    """Options every strategy understands; strategies subclass it with their own knobs."""
    name: str = MISSING
    dp_replicate: int = crossed(1, 2)
    dp_shard: int = 1
    tp: int = crossed(1, 2)
    pp: int = crossed(1, 2)
    pp_schedule: str = crossed("1F1B", *(s for s in PP_SCHEDULES if s != "1F1B"))
    pp_microbatches: Optional[int] = None   # null: a data-parallel rank's share / micro_batch_size, at least pp
    pp_virtual_stages: int = crossed(1, 2)             # 2+ for Interleaved1F1B / LoopedBFS / InterleavedZeroBubble, 2 for ZBV/DualPipeV
    cp: int = crossed(1, 2)                            # context parallel: ranks that split every sequence (parallel=3d)
    sequence_parallel: bool = crossed(False, True)
    ep: int = crossed(1, 2)                            # expert parallelism (parallel=3d): MoE experts sharded over the dp ranks


@dataclass
class AutoParallelConfig(ParallelConfig):
    """parallel=auto: the planner picks the layout (strategy, zero, degrees, schedule, AC, micro-batch)."""
    name: str = "auto"
    strategies: list[str] = field(default_factory=lambda: ["single", "ddp", "fsdp", "deepspeed", "3d"])
    top: int = 5                            # layouts printed, best first


@dataclass
class ZeroConfig:
    stage: int = 0
    offload_optimizer: bool = crossed(False, True)
    offload_params: bool = crossed(False, True)


@dataclass
class PrecisionConfig:
    name: OneOf[COMPUTE_DTYPES] = "fp32"                   # fp32 | bf16 | fp16 | float8
    param_dtype: OneOf[DTYPES] = "float32"    # compute dtype: autocast dtype, or FSDP2's all-gather dtype
    reduce_dtype: OneOf[DTYPES] = "float32"   # gradient reduction dtype (FSDP2); master weights stay fp32
    allow_tf32: bool = True             # CUDA: fp32 matmuls on TF32 tensor cores (MFU then uses the TF32 peak)
    float8_recipe: OneOf[FLOAT8_RECIPES] = crossed("tensorwise", *FLOAT8_RECIPES[1:])   # float8: tensorwise (FSDP2 all-gathers float8) | rowwise (one scale a row)
    float8_emulate: bool = crossed(False, True)       # float8: emulate the float8 matmuls (numerics only: tests, CPU)
    # fp16 dynamic loss scaling (torch.amp.GradScaler)
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass
class ActivationCheckpointingConfig:
    # none | full | layer (every_n_layers blocks) | op (every block, matmul and attention outputs kept);
    # a str, not a Literal: OmegaConf 2.3 rejects Literal annotations
    mode: str = crossed("none", *(m for m in AC_MODES if m != "none"))
    every_n_layers: int = 2     # layer: checkpoint every Nth block
    save_matmuls: bool = False  # layer: inside checkpointed blocks keep matmul outputs, recompute the rest
    save_every_nth_matmul: int = crossed(1, 2) # where matmul outputs are kept: only every nth (2 = torchtitan's op policy)
    block_classes: list[str] = field(default_factory=list)   # empty = the model's block_classes()


@dataclass
class OptimizerConfig:
    _target_: str = MISSING
    lr: float = MISSING
    weight_decay: float = 0.0


@dataclass
class AdamWConfig(OptimizerConfig):
    _target_: str = "torch.optim.AdamW"
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    foreach: Optional[bool] = None


@dataclass
class SGDConfig(OptimizerConfig):
    _target_: str = "torch.optim.SGD"
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False


@dataclass
class SchedulerConfig:
    name: OneOf[SCHEDULES] = MISSING
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1   # cosine decays to lr * min_lr_ratio at max_steps


@dataclass
class MixSourceConfig:
    path: str = MISSING                 # a prepared dataset dir, a Megatron prefix, or a flat token file
    weight: float = 1.0                 # relative share of the sequences drawn from this source
    name: Optional[str] = None          # metrics key tokens/<name>; null = the path's base name


@dataclass
class DataConfig:
    name: str = MISSING
    seq_len: int = 128
    source: OneOf[SOURCES] = MISSING
    path: Optional[str] = None          # text file; token file or prepared dataset dir; Megatron .bin/.idx prefix
    dtype: OneOf[TOKEN_DTYPES] = "uint16"   # flat token files (dataset dirs and Megatron say their own)
    vocab_size: int = 256               # byte-level for pydoc and text; a prepared dataset's manifest sets it
    eos_id: Optional[int] = None        # from a prepared dataset's manifest
    tokenizer: Optional[str] = None     # bytes | a tokenizer.json; a prepared dataset's manifest sets it
    sources: list[MixSourceConfig] = field(default_factory=list)   # mix only
    val_fraction: float = 0.05
    num_tokens: int = 1_000_000         # synthetic only


@dataclass
class ProfileConfig:
    steps: list[int] = field(default_factory=list)   # [first, last] step to trace (1-based); empty = off
    memory_snapshot: bool = False       # CUDA: also record the allocator history over those steps


@dataclass
class TrainerConfig:
    max_steps: int = 200
    global_batch_size: int = 16
    micro_batch_size: Optional[int] = None  # null = global_batch_size / data-parallel degree (no accumulation)
    log_every: int = 10
    eval_every: int = 100               # 0 = never; otherwise every N steps and at the end
    eval_batches: int = 2
    sample_every: int = 0               # 0 = never; otherwise log a continuation of sample_prompt every N steps
    sample_prompt: str = ""             # "" = start from the end-of-text token
    sample_tokens: int = 32
    grad_clip: float = 1.0              # 0 = no clipping (the norm is still measured)
    stop_at_step: Optional[int] = None  # end this run early (the schedule still spans max_steps); resume later
    on_nonfinite: OneOf["abort", "skip"] = "abort"   # what a NaN/inf loss or gradient does
    progress_bar: bool = True
    # No step finished for this long: every rank writes its stacks to <run dir>/stall/ and the job
    # fails. Below launcher.timeout_s, so a rank stuck outside a collective is caught (with evidence)
    # before its peers' collectives time out. 0 = off.
    stall_timeout_s: float = 900.0
    objective: str = "val_loss"         # the metric whose final value the run returns to a sweeper (Optuna)
    deterministic: bool = crossed(False, True)        # GPU runs repeat exactly (slower kernels); CPU runs always do
    compile: bool = crossed(False, True)              # torch.compile each block (torch-native strategies); compile_time logged apart
    # trainer.compile's torch.compile backend: inductor (fused kernels), or aot_eager / eager, which trace the same
    # graphs without generating code (to tell whether a failure is inductor's, and to check composition cheaply)
    compile_backend: OneOf[COMPILE_BACKENDS] = "inductor"
    profile: ProfileConfig = field(default_factory=ProfileConfig)


@dataclass
class CheckpointConfig:
    enabled: bool = True                # save at the end, and every `interval` steps if > 0
    dir: Optional[str] = None           # default: <run dir>/checkpoints
    interval: int = 0
    resume: Optional[str] = None        # null | auto (newest complete in dir) | <path of a step dir>
    keep_last: int = 2
    async_save: bool = crossed(False, True)           # write in the background (torch-native strategies; `async` is a keyword)
    initial_load: Optional[str] = None  # a dir of HF-layout safetensors to start the weights from


@dataclass
class LauncherConfig:
    nproc_per_node: Optional[int] = None    # null = what the strategy's degrees need
    max_restarts: int = 0
    monitor_interval: float = 0.1
    backend: Optional[str] = None           # null = nccl on CUDA (plus gloo when offloading), gloo otherwise
    # A collective that cannot complete (a peer died or hangs) raises after this long on every rank,
    # so the elastic agent restarts the group or gives up. Generous enough for a first DeepSpeed op
    # build or a large checkpoint on a slow disk; lower it to fail faster.
    timeout_s: float = 1200.0
    # signals that stop the run after the current step with a checkpoint and exit code 143 (requeue me):
    # SLURM's and Kubernetes' SIGTERM, `sbatch --signal` USR1, submitit's USR2
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGUSR2"])
    # After passing a signal on, the launcher's elastic agent waits this long for the workers to finish
    # their step, vote, save and exit before it SIGKILLs them (torch's own default is 30 s). Sized for
    # the llama3_8b recipe's preemption save (README, "Signals"); a larger model or slower disk needs more.
    stop_grace_s: float = 180.0


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    peak_flops: Optional[float] = None      # per device; null = look up the device
    cpu_peak_flops: float = 3.0e11          # what MFU is measured against on CPU


@dataclass
class PlannerConfig:
    device: Optional[str] = None        # h100 | h100_pcie | h200 | a100_40gb | a100_80gb | b200 | mi300x | cpu; null = detected
    nodes: int = 1
    gpus_per_node: Optional[int] = None  # null = launcher.nproc_per_node, else 8 for a GPU from the table
    check: bool = True                  # refuse (exit 2) a job the plan says cannot fit the device
    time_on_device: bool = True         # python -m framework.plan on a GPU: time the job's blocks there


@dataclass
class Config:
    parallel: Any = MISSING
    zero: ZeroConfig = MISSING
    precision: PrecisionConfig = MISSING
    activation_checkpointing: ActivationCheckpointingConfig = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    scheduler: SchedulerConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    seed: int = 0
    device: OneOf["auto", "cpu", "cuda"] = "auto"
